"""The alphabets of the names the agent keys things by: env ids and holder names.

Every name that arrives from outside (a URL, a query argument, the command line, a kernel)
is checked here, with full matches, before anything (a path, a query) is built from it.
"""

from __future__ import annotations

import re

from ..errors import InvalidName

__all__ = ["ENV_ID_LENGTH", "check_holder", "is_env_id", "is_env_id_prefix"]

#: An env id is the sha256 of the canonical spec: 64 lowercase hex digits.
ENV_ID_LENGTH = 64
_ENV_ID = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"[0-9a-f]{1,64}")
#: Holders are recorded, never used as paths; kept printable and short all the same
#: (``user``, ``cli``, ``kernel:<uuid>/pool:12:1:0123abcd4567``).
MAX_HOLDER_LENGTH = 512
_HOLDER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+=-]{0,511}")


def is_env_id(text: object) -> bool:
    """Whether ``text`` is a whole env id."""
    return isinstance(text, str) and _ENV_ID.fullmatch(text) is not None


def is_env_id_prefix(text: object) -> bool:
    """Whether ``text`` could start an env id (1 to 64 lowercase hex digits)."""
    return isinstance(text, str) and _PREFIX.fullmatch(text) is not None


def check_holder(holder: object) -> str:
    """``holder`` if it is a valid holder name; ``InvalidName`` saying why otherwise."""
    if not isinstance(holder, str) or not holder:
        raise InvalidName("holder: expected a non-empty name")
    if len(holder) > MAX_HOLDER_LENGTH:
        raise InvalidName(f"holder: longer than {MAX_HOLDER_LENGTH} characters")
    if _HOLDER.fullmatch(holder) is None:
        raise InvalidName(
            "holder: only letters, digits and _ . : @ / + = - are allowed, starting with a"
            f" letter, digit or _ (got {holder[:80]!r})"
        )
    return holder
