"""Why a worker was killed by someone else: notes left by the one who stopped it.

A worker stopped from the sidebar dies by SIGKILL (its task may be stuck in C code), which
the kernel alone would report as "killed by signal 9 (SIGKILL)": that reads like the OOM
killer. So the Jupyter server, just before it kills a worker a kernel reported, leaves a note
in a directory it owns (``NOTES_ENV_VAR``, which the kernels it starts inherit): one file per
pid saying who stopped it and where. The kernel's process reader takes the note (reading and
deleting it) when it finds that pid dead by SIGKILL and says that instead.

A note is trusted only while it is fresh (``MAX_AGE``): the server removes it when its kill
failed, and the pid it names was a live child of the kernel when it was written, so a stale
note can only be a leftover whose worker's death nobody read. Stdlib only.

Who calls it: ``server/kernels.py`` (``leave``/``withdraw``), ``process.py`` (``take``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

NOTES_ENV_VAR = "JUPYTER_RUNTIMEENV_STOP_NOTES"
#: Seconds a note stands: between the kill and the reader noticing the death.
MAX_AGE = 600.0


def leave(directory: str, pid: int, reason: str) -> None:
    """Write the note for ``pid`` in ``directory`` (whole, by a rename): ``reason`` completes
    "worker pid N ..." ("stopped from the sidebar by alice")."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{pid}-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump({"reason": reason, "at": time.time()}, file)
        os.replace(tmp, os.path.join(directory, str(pid)))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def withdraw(directory: str, pid: int) -> None:
    """Remove the note for ``pid`` (its kill failed: the worker was already gone)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, str(pid)))


def take(pid: int) -> str | None:
    """The reason a note in this process's notes directory gives for ``pid``'s death, the
    note removed; ``None`` without a fresh, readable note."""
    directory = os.environ.get(NOTES_ENV_VAR)
    if not directory:
        return None
    path = os.path.join(directory, str(pid))
    try:
        with open(path, encoding="utf-8") as file:
            note = json.load(file)
        os.unlink(path)
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict):
        return None
    reason, at = note.get("reason"), note.get("at")
    if not isinstance(reason, str) or not isinstance(at, (int, float)):
        return None
    if time.time() - at > MAX_AGE:
        return None
    return reason
