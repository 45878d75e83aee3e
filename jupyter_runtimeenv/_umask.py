"""The process's umask, read without setting it.

``os.umask`` can only be read by setting it, which races with other threads creating files
(one creating a file between the set and the restore gets the temporary mask); Linux shows
the mask in ``/proc/self/status`` (4.7+). Each caller states what an unknown mask means to
it: ``workers/template`` (what a forked worker must inherit) sets and restores it,
``plugins/_blobs`` (which modes a stored blob can have) takes every bit as masked.

Standard library only, like ``_cpuload``: neither ``workers`` nor ``plugins`` imports the
other for it.
"""

from __future__ import annotations

STATUS = "/proc/self/status"


def read_umask(path: str = STATUS) -> int | None:
    """The umask ``path`` (``/proc/self/status``) shows, ``None`` where it cannot be read or
    shows none."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None
