"""matplotlib in a ``%%remote`` cell's worker: a backend that does what matplotlib-inline does.

Shipped by value with the cell runner (the standard library at import; matplotlib when the
cell uses it). ``module://`` + ``BACKEND`` is chosen through ``MPLBACKEND`` before a cell
imports matplotlib (unless the env chose another backend): ``plt.show()`` shows every open
figure and closes them; ``flush_figures`` (after the cell) shows the figures left open, after
the cell's result, and closes them; figures are printed as IPython's
``pylabtools.print_figure`` prints them, in the kernel's formats and ``print_figure_kwargs``.
Showing goes through the ``display`` of ``_cell_display`` (kept in ``state()``).

The backend module is also where everything that lives as long as the worker is kept
(``state()``): this file arrives by value with each cell.
"""

from __future__ import annotations

import base64
import os
import sys
import types
from typing import Any

#: The worker-side matplotlib backend's module name.
BACKEND = "_jupyter_runtimeenv_inline"
#: MPLBACKEND values the kernel hands its workers that mean "inline" (ipykernel sets the
#: first); any other value was chosen on purpose and is kept.
INLINE_BACKENDS = ("module://matplotlib_inline.backend_inline", "inline", "")

_FIGURE_MIMES = {
    "png": "image/png",
    "retina": "image/png",
    "png2x": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "svg": "image/svg+xml",
    "pdf": "application/pdf",
}


# -- the worker's per-process state ------------------------------------------------------


def state() -> dict[str, Any]:
    """The state kept across cells: on the backend module, created on first use."""
    module = sys.modules.get(BACKEND)
    if module is None:
        module = types.ModuleType(BACKEND, "matplotlib backend of jupyter-runtimeenv cells")
        module.__dict__.update(
            _jre_state={
                "emit": None,  # writes one display message (set per cell)
                "figures": {"formats": ["png"], "print_kwargs": {"bbox_inches": "tight"}},
                "to_draw": [],
                "draw_called": False,
                "formatter": None,
                "rc_applied": False,
                "display": None,  # _cell_display.display, set per cell
            },
            __getattr__=_backend_attribute,
            new_figure_manager=new_figure_manager,
            new_figure_manager_given_figure=new_figure_manager_given_figure,
            show=show,
            backend_version="jupyter-runtimeenv",
        )
        sys.modules[BACKEND] = module
    return module.__dict__["_jre_state"]  # type: ignore[no-any-return]


# -- figures -----------------------------------------------------------------------------


def is_figure(obj: Any) -> bool:
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def register_figure_formatters(formatter: Any) -> None:
    figure = sys.modules.get("matplotlib.figure")
    if figure is None or getattr(formatter, "_jre_figures", None) is state()["figures"]:
        return
    formats = _formats()
    for mime in set(_FIGURE_MIMES.values()):
        formatter.formatters[mime].pop(figure.Figure, None)
    for fmt in formats:
        mime = _FIGURE_MIMES[fmt]

        def render(fig: Any, fmt: str = fmt) -> Any:
            return print_figure(fig, fmt)

        formatter.formatters[mime].for_type(figure.Figure, render)
    formatter._jre_figures = state()["figures"]


def _formats() -> list[str]:
    wanted = [str(f).lower() for f in state()["figures"].get("formats") or ["png"]]
    return [f for f in wanted if f in _FIGURE_MIMES] or ["png"]


def print_figure(fig: Any, fmt: str) -> Any:
    """One format of ``fig`` as IPython's ``pylabtools.print_figure`` makes it (``None`` for
    an empty figure); retina PNGs come with their halved size as metadata."""
    if not fig.axes and not fig.lines:
        return None
    from io import BytesIO

    kwargs = dict(state()["figures"].get("print_kwargs") or {})
    dpi = fig.dpi
    name = fmt
    if fmt in ("retina", "png2x"):
        dpi, name = dpi * 2, "png"
    elif fmt == "jpeg":
        name = "jpg"
    options = {
        "format": name,
        "facecolor": fig.get_facecolor(),
        "edgecolor": fig.get_edgecolor(),
        "dpi": dpi,
        "bbox_inches": kwargs.pop("bbox_inches", "tight"),
    }
    options.update(kwargs)
    if fig.canvas is None:
        from matplotlib.backend_bases import FigureCanvasBase

        FigureCanvasBase(fig)
    buffer = BytesIO()
    fig.canvas.print_figure(buffer, **options)
    raw = buffer.getvalue()
    if name == "svg":
        return raw.decode("utf-8")
    encoded = base64.b64encode(raw).decode("ascii")
    if fmt in ("retina", "png2x"):
        width, height = _png_size(raw)
        return encoded, {"width": width // 2, "height": height // 2}
    return encoded


def _png_size(data: bytes) -> tuple[int, int]:
    import struct

    ihdr = data.index(b"IHDR")
    width, height = struct.unpack(">ii", data[ihdr + 4 : ihdr + 12])
    return width, height


def figure_bundle(fig: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A figure's mime bundle without IPython: the kernel's formats and its repr."""
    data: dict[str, Any] = {"text/plain": repr(fig)}
    metadata: dict[str, Any] = {}
    for fmt in _formats():
        got = print_figure(fig, fmt)
        if got is None:
            continue
        if isinstance(got, tuple):
            got, metadata[_FIGURE_MIMES[fmt]] = got
        data[_FIGURE_MIMES[fmt]] = got
    return data, metadata


def _figure_metadata(fig: Any) -> dict[str, Any] | None:
    """matplotlib-inline's hint for frontends: a transparent figure whose tick labels are
    all light (or all dark) needs a dark (light) background."""
    from matplotlib import colors

    if colors.to_rgba(fig.get_facecolor())[3] >= 0.5:
        return None
    labels = [
        label.get_color()
        for axes in fig.axes
        for axis in (axes.xaxis, axes.yaxis)
        for label in axis.get_ticklabels()
    ]
    if not labels:
        return None
    light = [colors.to_rgba(c)[:3] for c in labels]
    lightness = [r * 0.299 + g * 0.587 + b * 0.114 > 0.5 for r, g, b in light]
    if all(x == lightness[0] for x in lightness):
        return {"needs_background": "dark" if lightness[0] else "light"}
    return None


def _show_figure(fig: Any) -> None:
    display = state()["display"]
    if display is not None:
        display(fig, metadata=_figure_metadata(fig))


# -- the backend (``module://_jupyter_runtimeenv_inline``), as matplotlib-inline's ---------------


def _backend_attribute(name: str) -> Any:
    """What matplotlib reads from a backend module, imported only when it asks."""
    if name == "FigureCanvas":
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        matplotlib.interactive(True)  # as IPython's activate_matplotlib does
        current = state()
        rc = current["figures"].get("rc") or {}
        if rc and not current["rc_applied"]:
            matplotlib.rcParams.update(rc)
            current["rc_applied"] = True
        # A real attribute from now on: pyplot copies the module's vars into its backend.
        backend: Any = sys.modules[BACKEND]
        backend.FigureCanvas = FigureCanvasAgg
        return FigureCanvasAgg
    if name == "FigureManager":
        from matplotlib.backend_bases import FigureManagerBase

        return FigureManagerBase
    raise AttributeError(f"module {BACKEND!r} has no attribute {name!r}")


def new_figure_manager(num: Any, *args: Any, FigureClass: Any = None, **kwargs: Any) -> Any:
    if FigureClass is None:
        from matplotlib.figure import Figure as FigureClass
    return new_figure_manager_given_figure(num, FigureClass(*args, **kwargs))


def new_figure_manager_given_figure(num: Any, figure: Any) -> Any:
    import matplotlib
    from matplotlib.backends import backend_agg

    agg: Any = backend_agg
    manager = agg.new_figure_manager_given_figure(num, figure)
    if not hasattr(figure, "show"):
        figure.show = lambda *_args: _show_figure(figure)
    if not matplotlib.is_interactive():
        return manager
    current = state()
    if figure in current["to_draw"]:
        current["to_draw"].remove(figure)
    current["to_draw"].append(figure)
    current["draw_called"] = True
    return manager


def show(close: Any = None, block: Any = None) -> None:
    """``plt.show()``: every open figure, in order, then closed."""
    from matplotlib._pylab_helpers import Gcf

    current = state()
    if close is None:
        close = current["figures"].get("close", True)
    try:
        for manager in Gcf.get_all_fig_managers():
            _show_figure(manager.canvas.figure)
    finally:
        current["to_draw"] = []
        if close and Gcf.get_all_fig_managers():
            import matplotlib.pyplot

            matplotlib.pyplot.close("all")


def flush_figures() -> None:
    """The inline backend's post-execute step: show what changed, close if configured."""
    current = state()
    if not current["draw_called"]:
        return
    try:
        if current["figures"].get("close", True):
            show(True)
            return
        from matplotlib._pylab_helpers import Gcf

        active = {manager.canvas.figure for manager in Gcf.get_all_fig_managers()}
        for fig in [fig for fig in current["to_draw"] if fig in active]:
            _show_figure(fig)
    finally:
        current["to_draw"] = []
        current["draw_called"] = False


def apply_style(style: dict[str, Any]) -> None:
    """The notebook's matplotlib style (``_remote_stream.kernel_style``), which changed since
    this worker last took it: matplotlib's defaults, then each setting the notebook changed
    (one this matplotlib does not know, or refuses, is passed over)."""
    try:
        import matplotlib
    except ImportError:  # the env has no matplotlib: the cells draw nothing
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        matplotlib.rc_file_defaults()
        for key, value in {**style, **(state()["figures"].get("rc") or {})}.items():
            try:  # noqa: SIM105 - the worker imports as little as it can
                matplotlib.rcParams[key] = value
            except (KeyError, ValueError, TypeError):
                pass


#: matplotlib's ``STYLE_BLACKLIST``: settings of the process, not of a figure's style.
NOT_STYLE = frozenset(
    {
        "backend",
        "backend_fallback",
        "date.epoch",
        "docstring.hardcopy",
        "figure.max_open_warning",
        "figure.raise_window",
        "interactive",
        "savefig.directory",
        "timezone",
        "tk.window_focus",
        "toolbar",
        "webagg.address",
        "webagg.open_in_browser",
        "webagg.port",
        "webagg.port_retries",
    }
)


def rc_snapshot() -> dict[str, Any] | None:
    """The worker's ``rcParams`` as they are (None before matplotlib is imported)."""
    params = getattr(sys.modules.get("matplotlib"), "rcParams", None)
    return None if params is None else dict.copy(params)


def style_changes(before: dict[str, Any] | None) -> bytes | None:
    """The style settings a cell changed (``plt.style.use``, ``plt.rc``, ``rcParams[...] =``),
    pickled for the kernel to take as the newest (``_remote_stream.take_style``); None if
    none changed. ``before``: ``rc_snapshot()`` as the cell began."""
    matplotlib = sys.modules.get("matplotlib")
    params = getattr(matplotlib, "rcParams", None)
    if params is None:
        return None
    if before is None:  # imported by the cell: its settings began as matplotlib's
        before = dict.copy(getattr(matplotlib, "rcParamsOrig", {}))
    changed = {}
    for key, value in dict.items(params):
        if key in NOT_STYLE:
            continue
        try:
            same = bool(value == before.get(key))
        except Exception:  # a value that does not compare: take it as changed
            same = False
        if not same:
            changed[key] = value
    if not changed:
        return None
    import pickle

    try:
        return pickle.dumps(changed)
    except Exception:  # a setting that does not pickle: the kernel keeps its own style
        return None


def use_inline() -> None:
    """``%matplotlib inline`` in a cell: this module's backend from now on."""
    os.environ["MPLBACKEND"] = "module://" + BACKEND
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.switch_backend("module://" + BACKEND)


def choose_backend() -> None:
    """Before a cell: this backend for a matplotlib the cell has not imported yet, or for
    one imported with the kernel's inline backend (a setup hook); else as it is."""
    chosen = os.environ.get("MPLBACKEND", "")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        if chosen in INLINE_BACKENDS:
            os.environ["MPLBACKEND"] = "module://" + BACKEND
            # matplotlib imported already (unpickling the cell's inputs, or the notebook's
            # style, imports it) read the kernel's MPLBACKEND then: pyplot would use it.
            matplotlib = sys.modules.get("matplotlib")
            params = getattr(matplotlib, "rcParams", None)
            if params is not None and str(params._get("backend")) in INLINE_BACKENDS[:2]:
                params["backend"] = "module://" + BACKEND
    elif str(sys.modules["matplotlib"].rcParams._get("backend")) in INLINE_BACKENDS[:2]:
        use_inline()
