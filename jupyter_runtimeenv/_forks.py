"""Where a helper process can be forked from a warm process instead of started anew.

``plugins/_hashhelp`` starts the hash helper (``plugins/_hash_child.py``) on the path of a
process's first large tree: from its start to its first answer a new ``python -I -S`` is
15-16 ms here (quiet), a child forked from a zygote template that is up already
(``workers/zygote``, for this process's workers, which imported hashlib) ~4 ms.
``workers/zygote`` sets ``hash_helper`` when it is imported; ``_hashhelp`` calls it through
``fork_hash_helper``, and spawns the helper itself when that returns None (no template of
this interpreter ready, the fork failed, or no worker machinery in this process). Neither
``workers`` nor ``plugins`` imports the other for it.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``hash_helper(stdin, stdout, program, idle_s)``: the pid of a helper running ``program``
#: (``_hash_child.py``'s path) on those two descriptors (the caller closes its copies), our
#: child; None if there is nowhere to fork it from now (never waits for a template to start).
HashHelperFork = Callable[[int, int, str, float], "int | None"]

hash_helper: HashHelperFork | None = None


def fork_hash_helper(stdin: int, stdout: int, program: str, idle_s: float) -> int | None:
    """``hash_helper``'s pid, or None where it is not set or could not fork one."""
    fork = hash_helper
    if fork is None:
        return None
    try:
        return fork(stdin, stdout, program, idle_s)
    except OSError:
        return None
