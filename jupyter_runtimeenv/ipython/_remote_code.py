"""What the kernel reads from a ``%%remote`` body before sending it (no I/O, no workers).

Who calls it: ``remote_cell.RemoteCellMagics``. ``prepare`` runs IPython's input transforms
on the body (so ``%time``, ``!ls``, ``x = !cmd`` become calls on ``get_ipython()``, which the
worker's ``_cell_magics.RemoteShell`` answers), refuses a magic the worker cannot run with
one line naming it, and finds:

- the names the body reads, in order: from its code, from the statements given to
  ``%time``/``%timeit``, from ``{expr}``/``$name`` in shell commands, and the ``@name``
  references pandas resolves inside ``DataFrame.query``/``eval`` and ``pd.eval`` strings;
- the names it changes in place (``df['c'] = ...``, ``obj.attr = ...``, ``x += 1``, a method
  that changes its object: ``lst.append(x)``, ``df.sort_values(..., inplace=True)``): a value
  changed by a cell lives where that cell ran (``_remote_namespaces``); and the objects whose
  methods it calls (``rng.integers(...)`` changes a random generator: ``stateful``);
- whether it ends with ``;`` (IPython's rule: then its value is not shown).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Any

from ._cell_magics import CELL_MAGICS, LINE_MAGICS, TEXT_MAGICS

__all__ = [
    "CellCode",
    "CodeError",
    "cell_frames",
    "inline_config",
    "local_reads",
    "method_receivers",
    "names_changed",
    "names_read",
    "plain_syntax_error",
    "prepare",
    "shell_aliases",
    "stateful",
]

#: pandas resolves ``@name`` (and ``@name.attr``) in these methods' expression strings.
_QUERY_METHODS = frozenset({"query", "eval"})
_AT_NAME = re.compile(r"@([A-Za-z_][A-Za-z_0-9]*)")
_SHELL_NAME = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)|\{([^{}]+)\}")
_SHELL_CALLS = frozenset({"system", "getoutput"})
#: Methods that change their object in place (lists, dicts, sets, pandas, NumPy arrays).
_MUTATORS = frozenset(
    {
        "add",
        "append",
        "clear",
        "discard",
        "extend",
        "fill",
        "insert",
        "pop",
        "popitem",
        "remove",
        "resize",
        "reverse",
        "setdefault",
        "sort",
        "update",
    }
)
#: Functions that change their first argument: ``next(it)``, ``random.shuffle(x)``/
#: ``rng.shuffle(x)``, ``heapq``'s and ``bisect.insort``'s (bare or through their module).
_ARGUMENT_CHANGERS = frozenset(
    {
        "next",
        "shuffle",
        "heapify",
        "heappop",
        "heappush",
        "heappushpop",
        "heapreplace",
        "insort",
        "insort_left",
        "insort_right",
    }
)
#: NumPy's functions that change their first argument (``np.copyto(dst, src)``); a ufunc's
#: ``at`` (``np.add.at(counts, i, 1)``) too.
_NUMPY_CHANGERS = frozenset({"copyto", "fill_diagonal", "place", "put", "putmask"})


class CodeError(Exception):
    """The body asks for something a worker cannot do; the message is one line."""


@dataclass
class CellCode:
    """A body ready to send."""

    source: str  # transformed, line 1 empty (line 1 of the cell is the %%remote line)
    tree: ast.Module
    reads: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    receivers: list[str] = field(default_factory=list)  # of its method calls
    quiet: bool = False
    #: Of ``reads``, those read before the cell binds them (``local_reads``): the others
    #: are sent if they can be (a branch may read the notebook's), not missed if not.
    needed: list[str] = field(default_factory=list)
    #: ``%config InlineBackend...`` lines: the kernel applies them before it sends the cell
    #: (its worker draws figures in the kernel's formats).
    inline_config: list[str] = field(default_factory=list)


def names_read(tree: ast.AST) -> list[str]:
    """Every name the code loads (at any depth; ``x += 1`` loads ``x``), in order of first
    appearance."""
    loads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    loads += [
        n.target
        for n in ast.walk(tree)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
    ]
    loads.sort(key=lambda n: (n.lineno, n.col_offset))
    return list(dict.fromkeys(n.id for n in loads))


def _names_bound(statement: ast.stmt) -> set[str]:
    """Names a top-level statement binds anew (not those it changes in place)."""
    bound = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return bound


def names_changed(tree: ast.AST) -> list[str]:
    """Names a statement rebinds or changes in place, at the top level of the cell (what
    a function body does to its locals is its own): assignment targets, the object of a
    ``x[...] =``/``x.a =``/``del x[...]``, augmented assignments, imports, ``def``/``class``,
    ``for``/``with`` targets and ``:=``, the object of a method that changes it
    (``_MUTATORS``, or any method called with ``inplace=True``), the first argument of a
    function that changes it (``next(it)``, ``np.add.at(counts, i, 1)``) and ``out=``."""
    found: list[str] = []

    def base(node: ast.AST) -> None:
        while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
            node = node.value
        if isinstance(node, ast.Name):
            found.append(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                base(element)

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(node.name)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
            return
        if isinstance(node, ast.Assign):
            for target in node.targets:
                base(target)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            base(node.target)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                base(target)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            base(node.target)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    base(item.optional_vars)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                found.append((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.NamedExpr):
            base(node.target)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                inplace = any(
                    k.arg == "inplace"
                    and isinstance(k.value, ast.Constant)
                    and k.value.value is True
                    for k in node.keywords
                )
                if inplace or node.func.attr in _MUTATORS:
                    base(node.func.value)
            if node.args and _changes_its_argument(node.func):
                base(node.args[0])
            for keyword in node.keywords:
                if keyword.arg == "out":  # np.add(a, b, out=c)
                    base(keyword.value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return list(dict.fromkeys(found))


def _changes_its_argument(function: ast.expr) -> bool:
    """Whether a call of ``function`` changes its first argument (``_ARGUMENT_CHANGERS``,
    ``_NUMPY_CHANGERS`` through ``np``/``numpy``, a ufunc's ``at``)."""
    if isinstance(function, ast.Name):
        return function.id in _ARGUMENT_CHANGERS
    if not isinstance(function, ast.Attribute):
        return False
    if function.attr == "at":
        return isinstance(function.value, ast.Attribute)  # np.add.at, not frame.at
    if function.attr in _NUMPY_CHANGERS:
        return isinstance(function.value, ast.Name) and function.value.id in ("np", "numpy")
    return function.attr in _ARGUMENT_CHANGERS


def method_receivers(tree: ast.AST) -> list[str]:
    """The names whose methods the code calls at the top level of the cell (``rng`` of
    ``rng.integers(3)``)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return
        function = node.func if isinstance(node, ast.Call) else None
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
            found.append(function.value.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return list(dict.fromkeys(found))


def stateful(value: object) -> bool:
    """Whether every method call may change ``value``: a random generator (NumPy's
    ``Generator``/``RandomState``, ``random.Random``), whose draws advance its state."""
    kind = type(value)
    return kind.__name__ in ("Generator", "RandomState", "Random", "SystemRandom") and (
        kind.__module__.startswith(("numpy.random", "random"))
    )


def _query_names(tree: ast.AST) -> list[str]:
    """``@name`` in the expression string of ``x.query(...)``/``x.eval(...)``/``pd.eval``."""
    found: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in _QUERY_METHODS:
            continue
        strings = [node.args[0]] if node.args else []
        strings += [kw.value for kw in node.keywords if kw.arg == "expr"]
        for value in strings:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.extend(_AT_NAME.findall(value.value))
    return found


def _magic_calls(tree: ast.AST) -> list[tuple[str, str, list[str]]]:
    """``(method, magic name, string arguments)`` of each ``get_ipython().method(...)``."""
    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if not (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "get_ipython"
        ):
            continue
        strings = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        calls.append((node.func.attr, strings[0] if strings else "", strings[1:]))
    return calls


def _parse_names(text: str) -> list[str]:
    try:
        return names_read(ast.parse(text))
    except (SyntaxError, ValueError):
        return []


def _check_magics(
    tree: ast.AST, strict: bool = True, aliases: frozenset[str] = frozenset()
) -> list[str]:
    """Refuse what the worker cannot run (``strict``; else pass over it); the names read by
    the magics' own code. ``aliases``: the kernel's shell aliases (``%ls``, ``%cat``), which
    the worker runs as commands."""
    reads: list[str] = []
    for method, first, rest in _magic_calls(tree):
        if method == "run_line_magic" and first in aliases:
            reads += _expanded_names(rest[0] if rest else "")
        elif method == "run_line_magic" and first == "config" and _inline(rest):
            continue  # the kernel applies it (``inline_config``)
        elif method == "run_line_magic":
            if first not in LINE_MAGICS:
                if strict:
                    raise CodeError(_refusal(f"%{first}"))
                continue
            line = rest[0] if rest else ""
            if strict and first == "matplotlib" and line.strip() not in ("", "inline"):
                raise CodeError(
                    f"%matplotlib {line.strip()}: a %%remote cell shows its figures inline"
                    " (as PNG and the kernel's figure formats)"
                )
            if first in ("time", "timeit"):
                reads += _parse_names(re.sub(r"^(\s*-[nrp]\s*\d+|\s*-[qo])*", "", line))
        elif method == "run_cell_magic":
            if first not in CELL_MAGICS:
                if strict:
                    raise CodeError(_refusal(f"%%{first}"))
                continue
            if first in TEXT_MAGICS:  # the body is text: its line may expand {name}
                reads += _expanded_names(rest[0] if rest else "")
                continue
            reads += _parse_names(rest[1] if len(rest) > 1 else "")
        elif method in _SHELL_CALLS:
            reads += _expanded_names(first)
        elif strict:
            raise CodeError(
                f"get_ipython().{method} cannot run in a %%remote cell: the cell runs in a"
                " worker of the environment, not in the kernel"
            )
    return reads


def _inline(rest: list[str]) -> bool:
    """Whether a ``%config`` line sets the inline backend's figure settings."""
    return bool(rest) and rest[0].lstrip().startswith("InlineBackend.")


def inline_config(tree: ast.AST) -> list[str]:
    """The cell's ``%config InlineBackend.x = y`` lines, in order."""
    return [
        rest[0]
        for method, first, rest in _magic_calls(tree)
        if method == "run_line_magic" and first == "config" and _inline(rest)
    ]


def _expanded_names(text: str) -> list[str]:
    """The names ``$name`` and ``{expression}`` read in a command IPython expands."""
    reads: list[str] = []
    for name, expression in _SHELL_NAME.findall(text):
        reads += [name] if name else _parse_names(expression)
    return reads


def _refusal(magic: str) -> str:
    allowed = ", ".join(f"%{m}" for m in sorted(LINE_MAGICS))
    hint = ""
    if magic in ("%pip", "%conda", "%uv"):
        hint = "; add packages to the env with %runtime_env --pip ..."
    elif magic in ("%%remote", "%runtime_env", "%%runtime_env"):
        hint = "; run it in a cell of its own"
    return (
        f"{magic} cannot run in a %%remote cell (a worker runs {allowed}, %%time, %%timeit,"
        f" %%writefile, the shell aliases (%ls, %cat...), !cmd and x = !cmd; the kernel"
        f" applies %config InlineBackend...){hint}"
    )


def quiet(source: str) -> bool:
    """IPython's ``DisplayHook.semicolon_at_end_of_expression``: the last token is ``;``."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    skip = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    for token in reversed(tokens):
        if token.type in skip:
            continue
        return token.type == tokenize.OP and token.string == ";"
    return False


def local_reads(body: str) -> list[str]:
    """The names a notebook's own cell (already through IPython's input transforms) reads
    before it binds them, found as ``prepare`` finds a remote cell's; any magic is allowed.
    ``fig, ax = plt.subplots()`` then ``ax.plot(...)`` reads ``plt``, not ``ax``."""
    try:
        tree = ast.parse(body)
    except (SyntaxError, ValueError):
        return []
    reads: list[str] = []
    bound: set[str] = set()  # by an earlier statement of the cell: its own value is read
    for statement in tree.body:
        found = names_read(statement) + _query_names(statement)
        found += _check_magics(statement, strict=False)
        reads += [name for name in found if name not in bound]
        bound |= _names_bound(statement)
    return list(dict.fromkeys(reads))


def prepare(
    cell: str, filename: str, transform: Any = None, aliases: frozenset[str] = frozenset()
) -> CellCode:
    """``cell`` through ``transform`` (IPython's ``transform_cell``), parsed and read;
    ``aliases``, the kernel's shell aliases, run in the worker as ``!cmd`` does.

    A ``SyntaxError`` is raised as Python raises it (the kernel shows it as a local one);
    ``CodeError`` when the body asks for what a worker cannot do.
    """
    body = transform(cell) if transform is not None else cell
    source = "\n" + body  # line 1 of the cell is the %%remote line
    tree = ast.parse(source, filename)
    reads = names_read(tree) + _query_names(tree) + _check_magics(tree, aliases=aliases)
    return CellCode(
        source=source,
        tree=tree,
        reads=list(dict.fromkeys(reads)),
        changes=names_changed(tree),
        receivers=method_receivers(tree),
        quiet=quiet(body),
        needed=local_reads(body),
        inline_config=inline_config(tree),
    )


def plain_syntax_error(shell: Any, cell: str, number: int, transform: Any) -> SyntaxError:
    """The ``SyntaxError`` of a ``%%remote`` cell's body as a cell of its own: the line
    numbers and file name (``Cell In[n], line k``, ``invalid syntax (<hash>.py, line k)``)
    IPython gives the same code in a plain cell, not counting the ``%%remote`` line."""
    body = transform(cell) if transform is not None else cell
    compiler = getattr(shell, "compile", None)
    name = f"<remote-cell-{number}>"
    if compiler is not None and hasattr(compiler, "cache"):
        name = str(compiler.cache(body, number, raw_code=_raw_body(shell, cell, number)))
    try:
        ast.parse(body, name)
    except SyntaxError as exc:
        return exc
    return SyntaxError(f"invalid syntax ({name})")  # only "\n" + body fails: not seen


def _raw_body(shell: Any, cell: str, number: int) -> str:
    """The body as the user typed it (ipykernel names a cell's file by a hash of it): the
    raw cell's lines after the ``%%remote`` line, from the history; IPython gave the magic
    the body with a newline added."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    try:
        raw = str(history[number])  # type: ignore[index]
    except (TypeError, IndexError):
        raw = ""
    first, newline, rest = raw.partition("\n")
    if first.lstrip().startswith("%%remote") and newline and cell.startswith(rest):
        return rest
    return cell[:-1] if cell.endswith("\n") else cell


def shell_aliases(shell: Any) -> dict[str, str]:
    """The shell's aliases (``%ls`` is ``ls -F --color``; ``%alias`` adds more): name ->
    command."""
    manager = getattr(shell, "alias_manager", None)
    try:
        return {str(name): str(command) for name, command in manager.aliases}  # type: ignore[union-attr]
    except Exception:  # not IPython's shell
        return {}


_FRAME = re.compile(
    r'^(?P<indent>[ \t]*)File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)$',
    re.MULTILINE,
)


def cell_frames(shell: Any, text: str) -> str:
    """``File "<cell file>", line k, in f`` lines of a traceback as IPython names cells:
    ``Cell In[n], line k``."""
    compiler = getattr(shell, "compile", None)
    names: dict[str, int] = getattr(compiler, "_filename_map", {}) or {}
    if not names:
        return text

    def rename(match: re.Match[str]) -> str:
        number = names.get(match.group("file"))
        if number is None:
            return match.group(0)
        where = match.group("name")
        tail = "" if where == "<module>" else f", in {where}"
        return f"{match.group('indent')}Cell In[{number}], line {match.group('line')}{tail}"

    return _FRAME.sub(rename, text)
