"""Zygote workers (the driver's side): a new worker in ~2 ms, forked from a template.

Who calls it: ``process.WorkerProcess._launch``, for every worker it starts (``fork``). One
template as the driver holds it is ``template.Template``; the template process itself is
``_zygote.py``.

For each interpreter and each set of start-time settings (the environment variables an
interpreter reads as it starts: ``PYTHON*``, the locale's ``LC_*``/``LANG``, ``HOME`` for
the user site, the dynamic loader's ``LD_*`` and glibc's tunables; plus the interpreter's own
flags, which come with it) this process keeps at most one template: a process started like
a worker that has imported the bootstrap and cloudpickle and forks workers on request. A
forked worker then takes the env's variables, cwd, ``sys.path``, and what else a spawned one
would inherit from the driver now (umask, resource limits, niceness, CPU affinity).

A worker is spawned as before (``fork`` returns None) when it cannot be forked exactly:

- its context has a command prefix (``nice``, ``taskset``, any wrapper that must exec) or
  says ``spawn_only`` (``py_executable``: the user named how their Python starts);
- its environment differs from the driver's in a start-time setting (``env_vars`` that set
  ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``LC_ALL``...);
- no template is ready in time. The worker that starts a template waits up to
  ``STARTING_WAIT`` for it and is forked from it: one interpreter start, where spawning it
  beside its template made two at once, which shared the CPUs: a fresh process's first call
  in an env_vars env, 8 pairs in turns at load 1.3-2, took 50-56 ms (median 51.7) this way
  and 54-73 ms (56.1) the other, and its second env's 5.6 ms against 9.7 (median); at load
  ~19, 95-116 against 69-167 ms; a fresh kernel's ``%runtime_env`` costs ~30 ms of CPU
  less. That is the first worker of the driver's own interpreter (``sys.executable``: every
  env without one of its own); an env's own interpreter (a pip/uv/conda env's venv) starts
  its template at its second worker, the first is spawned alone: its template is one more
  interpreter start, which pays only once a second worker comes (four new pip envs at once
  on 2 CPUs, W3, ran 1.4x their floor with a template each, 1.08x with none; after its
  template retired, the count starts again). A later worker waits up to ``READY_WAIT`` for a
  template that is starting; a template that cannot fork here (not Linux x86_64/aarch64 with
  glibc) or did not start is remembered, and its interpreter's workers are spawned;
- ``JUPYTER_RUNTIMEENV_ZYGOTE=0`` in the driver's environment.

A ready template of the driver's own interpreter also forks the hash helper of a new tree
(``fork_hash_helper``, ``plugins/_hashhelp``): ~4 ms to its first answer, not 15-16.

Templates stop when no worker was forked from them for ``idle_timeout`` seconds (the
largest of the pools that used them), when the driver exits (their lifeline), or with
``stop_all``. A forked worker is the driver's child (``clone(CLONE_PARENT)``): it is reaped,
killed by group and watched for its parent's death exactly like a spawned one. Differences
that remain: ``/proc/<pid>/environ`` shows the environment its template started with (the
worker's ``os.environ`` and its children's are the env's), and forked workers share their
template's string hash seed unless ``PYTHONHASHSEED`` fixes one.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping

from .. import _forks
from ..context import EnvContext
from .template import DEFAULT_IDLE_TIMEOUT, STARTUP_TIMEOUT, ForkedChild, Template

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "ZYGOTE_VAR",
    "ForkedChild",
    "Template",
    "fork",
    "start_time_settings",
    "stop_all",
]

ZYGOTE_VAR = "JUPYTER_RUNTIMEENV_ZYGOTE"
#: How long a worker waits for a template that is starting before it is spawned instead.
READY_WAIT = 0.1
#: How long the worker that starts a template waits for it: as long as the template may take
#: to start (``STARTUP_TIMEOUT``; then it has failed and the worker is spawned). A spawn
#: instead is an interpreter start too, as slow on a loaded machine: a shorter wait then
#: spawned after it, and the worker paid both.
STARTING_WAIT = STARTUP_TIMEOUT
_START_NAMES = frozenset(("LANG", "HOME", "GLIBC_TUNABLES"))
_START_PREFIXES = ("PYTHON", "LC_", "LD_", "MALLOC_")


def start_time_settings(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` an interpreter reads as it starts (sorted items)."""
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if name in _START_NAMES or name.startswith(_START_PREFIXES)
        )
    )


# -- the registry: one template per (interpreter, start-time settings) --------------------

_lock = threading.Lock()
_Key = tuple[tuple[str, int, int, int], tuple[tuple[str, str], ...]]
_templates: dict[_Key, Template] = {}
#: Interpreters other than the driver's whose first worker was spawned with no template
#: started (``_template``): the next worker of one starts it. The latest ``SPAWNED_ONCE``
#: only (a process may use thousands of one-off envs); one forgotten is spawned alone again.
_spawned_once: collections.OrderedDict[_Key, None] = collections.OrderedDict()
SPAWNED_ONCE = 1024
#: Templates out of the registry whose stop (in another thread) may not have returned yet:
#: ``stop_all`` stops them too, so that it returns with everything of theirs reaped.
_retiring: set[Template] = set()
_janitor: threading.Thread | None = None


def enabled() -> bool:
    return (
        sys.platform == "linux"
        and os.environ.get(ZYGOTE_VAR, "1") != "0"
        and hasattr(socket, "send_fds")
    )


def fork(
    ctx: EnvContext,
    env: dict[str, str],
    channel: int,
    *,
    entry: str,
    idle_timeout: float,
    extra: Mapping[str, str],
) -> ForkedChild | None:
    """A worker forked from ``ctx``'s template, or None: spawn it (see the module's
    docstring for when). ``env`` is the worker's whole environment (``process_env``);
    ``extra``: variables a template needs too (the bootstrap's, the same for every worker)."""
    if not enabled() or ctx.command_prefix or ctx.spawn_only:
        return None
    base = {**os.environ, **extra}
    settings = start_time_settings(env)
    if settings != start_time_settings(base):
        return None  # env_vars change how the interpreter starts: spawn exactly that
    try:  # a rebuilt venv at the same path is another interpreter: another template
        st = os.lstat(ctx.python)
    except OSError:
        return None  # the spawn reports it
    identity = (ctx.python, st.st_dev, st.st_ino, st.st_mtime_ns)
    template = _template(identity, settings, base, entry, idle_timeout)
    if template is None:
        return None
    cwd = ctx.cwd or os.getcwd()
    try:
        return template.fork(env, cwd, channel, idle_timeout)
    except OSError:
        return None  # spawned instead; the next worker starts a new template if it died


def _template(
    identity: tuple[str, int, int, int],
    settings: tuple[tuple[str, str], ...],
    base: dict[str, str],
    entry: str,
    idle_timeout: float,
) -> Template | None:
    """The ready template for ``python`` and ``settings``, or None: spawn. One that is
    starting is waited for ``READY_WAIT``; one this call starts, ``STARTING_WAIT``."""
    global _janitor
    key = (identity, settings)
    with _lock:
        template = _templates.get(key)
        wait = READY_WAIT
        if template is None and key not in _spawned_once and not _drivers(identity[0]):
            _spawned_once[key] = None
            if len(_spawned_once) > SPAWNED_ONCE:
                _spawned_once.popitem(last=False)
            return None  # an env's own interpreter: its first worker is spawned alone
        _spawned_once.pop(key, None)  # it has (or now starts) a template
        if template is None or template.state == "stopped":
            if template is not None:  # found dead by a fork: reap it and its spare
                _retiring.add(template)
                threading.Thread(target=_retire, args=(template,), daemon=True).start()
            template = Template(identity[0], base, entry)
            template.idle_timeout = idle_timeout  # the first pool's; the largest later
            _templates[key] = template
            threading.Thread(
                target=template.start, name=f"jupyter-runtimeenv-zygote-{len(_templates)}",
                daemon=True,
            ).start()  # fmt: skip
            if _janitor is None:
                _janitor = threading.Thread(
                    target=_reap_idle, name="jupyter-runtimeenv-zygote-janitor", daemon=True
                )
                _janitor.start()
            # Forked from the template it starts now (the driver's interpreter's first worker,
            # an env's own interpreter's second): one interpreter start, not two at once.
            wait = STARTING_WAIT
    template.ready.wait(wait)
    return template if template.state == "ready" else None


def _drivers(python: str) -> bool:
    """Whether ``python`` is how this process's own interpreter is named (an env's context
    names it unless the env has an interpreter of its own)."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def fork_hash_helper(stdin: int, stdout: int, program: str, idle_s: float) -> int | None:
    """A hash helper (``plugins/_hashhelp``, through ``_forks.hash_helper``) forked from a
    ready template of this very interpreter (the same binary: a venv's python is its base's),
    or None: it is spawned. No template is started or waited for here: a process whose
    workers made one (``run.py``'s W5, a notebook's later trees) has one up; a process's
    first tree before any worker spawns its helper as before."""
    ours = _binary(sys.executable) if enabled() and sys.executable else None
    if ours is None:
        return None
    with _lock:
        ready = [t for t in _templates.values() if t.state == "ready"]
    for template in ready:
        if _binary(template.python) != ours:
            continue
        try:
            return template.fork_hash_helper(stdin, stdout, program, idle_s)
        except OSError:
            continue
    return None


def _binary(python: str) -> tuple[int, int] | None:
    try:
        st = os.stat(python)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def templates() -> list[Template]:
    with _lock:
        return list(_templates.values())


def stop_all() -> None:
    """Stop every template (tests; a driver that wants nothing left running)."""
    with _lock:
        stopping = [*_templates.values(), *_retiring]
        _templates.clear()
        _spawned_once.clear()
    for template in stopping:
        template.stop()


def _retire(template: Template) -> None:
    """Stop a template taken out of the registry (``_retiring``, under ``_lock``)."""
    try:
        template.stop()
    finally:
        with _lock:
            _retiring.discard(template)


def _reap_idle() -> None:
    """The janitor thread: stops idle templates; ends when there is none left."""
    global _janitor
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        with _lock:
            if not _templates:
                _janitor = None
                return
            idle = [
                (key, t)
                for key, t in _templates.items()
                if t.state == "ready" and now - t.last_used > t.idle_timeout
            ]
            for key, template in idle:
                del _templates[key]
                _retiring.add(template)
        for _, template in idle:
            _retire(template)


def _after_fork_in_child() -> None:
    global _lock, _janitor
    # The templates are the parent's: our copies of their control sockets must not keep
    # one alive once the parent stops it.
    for template in _templates.values():
        sock = template._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    _templates.clear()
    _spawned_once.clear()
    _retiring.clear()
    _lock = threading.Lock()
    _janitor = None


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_after_fork_in_child)
_forks.hash_helper = fork_hash_helper
