"""Gitignore-style patterns (the spec's ``excludes`` and ``.gitignore`` files), matched without
regular expressions, in time linear in the path.

Who calls it: ``spec.parse`` (``check_excludes``: bounds and compiling at parse time) and
``plugins._hashing`` (which files of a ``working_dir``/``py_modules`` tree are left out).

Why not ``pathspec`` (or ``fnmatch``): they translate a pattern into a Python regular
expression, and ``re`` backtracks: ``*a*a*a*a*a*a*a*a*b`` against one long file name takes
time exponential in the number of stars while holding the GIL, which froze the whole Jupyter
server on one request. Here a pattern is compiled once into segments, and a segment is
matched by one of:

- string operations in C for the common shapes: a literal name, ``*.ext``, ``prefix*``, and
  in general literal chunks between stars (``startswith``/``endswith`` and a greedy
  left-most ``str.find`` per chunk, which is exact for ``*``);
- otherwise (``?``, ``[...]``) a bit-parallel NFA (shift-and): one Python step per character
  of the name, each a few operations on an integer holding one bit per pattern position.

``**`` segments are matched by the same NFA over path components. Nothing backtracks, so the
cost of one match is at most (path length) x (pattern length / 64) machine words, and the
number and length of patterns is bounded (``MAX_PATTERNS``, ``MAX_PATTERN_CHARS``).

Semantics are git's (``gitignore(5)`` and ``wildmatch.c``), checked against
``git check-ignore`` in the tests: ``#`` comments, trailing spaces trimmed unless escaped,
``!`` negation (the last matching pattern wins), a leading or middle ``/`` anchors the
pattern to its base directory (else it matches the name at any depth), a trailing ``/``
matches directories only, ``*`` and ``?`` never match ``/``, ``[...]`` with ranges,
``!``/``^`` negation and ``[:class:]``, ``\\`` escapes, ``**/``, ``/**/`` and ``/**``. A
pattern with an unclosed ``[`` or a bad ``[:class:]`` matches nothing, as in git. Names are
matched by character, not by UTF-8 byte (``?`` matches ``é``; git's ``?`` matches one byte).

This module holds patterns and lists of them; the tokens of a pattern and the match of one
path component are ``_wildmatch.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._wildmatch import GLOBSTAR, SEP, STAR, Never, Segment, Token, tokenize

__all__ = [
    "MAX_PATTERNS",
    "MAX_PATTERN_CHARS",
    "Pattern",
    "PatternError",
    "PatternList",
    "check_list",
    "compile_pattern",
]

#: At most this many patterns in the spec's ``excludes`` (and in one ``.gitignore``).
MAX_PATTERNS = 1000
#: At most this many characters in one pattern.
MAX_PATTERN_CHARS = 1024


class PatternError(ValueError):
    """A pattern list past its bounds; the message says which bound."""


# -- one pattern -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pattern:
    """One compiled line: ``text`` as given, whether it re-includes (``!``), whether it
    matches directories only (trailing ``/``), whether it is anchored to its base (a ``/``
    before the end: matched against the whole relative path, else against the name)."""

    text: str
    negated: bool
    dir_only: bool
    anchored: bool
    #: ``Segment``s, ``None`` for ``**``; empty if the pattern matches nothing.
    segments: tuple[Segment | None, ...]
    never: bool = False

    def matches(self, parts: Sequence[str], is_dir: bool) -> bool:
        """Whether the path ``parts`` (its components, relative to the base) matches."""
        if self.never or (self.dir_only and not is_dir) or not parts:
            return False
        if not self.anchored:
            segment = self.segments[0]
            return segment is None or segment.match(parts[-1])
        return _match_components(self.segments, parts)


def _match_components(segments: tuple[Segment | None, ...], parts: Sequence[str]) -> bool:
    # The NFA again, one step per path component: bit i = the first i segments matched;
    # ``**`` keeps its bit (it eats a component) and passes it on (it may eat none).
    globs = sum(1 << i for i, s in enumerate(segments) if s is None)
    # Bits of segments that consume one component (not "**", not the final accept bit).
    plain = ((1 << len(segments)) - 1) & ~globs
    state = 1 | ((1 & globs) << 1)
    for part in parts:
        moved = 0
        live = state & plain
        i = 0
        while live:
            if live & 1:
                segment = segments[i]
                if segment is not None and segment.match(part):
                    moved |= 1 << (i + 1)
            live >>= 1
            i += 1
        state = moved | (state & globs)
        state |= (state & globs) << 1
        if not state:
            return False
    return bool(state >> len(segments) & 1)


def compile_pattern(line: str) -> Pattern | None:
    """One ``.gitignore`` line compiled; ``None`` for blank lines and comments."""
    text = _trim_trailing_spaces(line)
    if not text or text.startswith("#"):
        return None
    negated = text.startswith("!")
    body = text[1:] if negated else text
    dir_only = body.endswith("/")
    if dir_only:
        body = body[:-1]
    anchored = "/" in body
    if body.startswith("/"):
        body = body[1:]
    try:
        tokens = tokenize(body)
    except Never:
        return Pattern(line, negated, dir_only, anchored, (), never=True)
    if not tokens:
        return Pattern(line, negated, dir_only, anchored, (), never=True)
    groups: list[list[Token]] = [[]]
    for token in tokens:
        if token == SEP:
            groups.append([])
        else:
            groups[-1].append(token)
    segments: list[Segment | None] = []
    for group in groups:
        if len(group) >= 2 and all(t == STAR for t in group) and anchored:
            if segments and segments[-1] is GLOBSTAR:
                continue  # "**/**" is "**"
            segments.append(GLOBSTAR)
        else:
            segments.append(Segment.of(group))
    if anchored and segments[-1] is GLOBSTAR:
        # A trailing "/**" matches everything *inside*: at least one more component.
        segments[-1:] = [Segment(("", "")), GLOBSTAR]
    if len(segments) == 2 and segments[0] is GLOBSTAR:
        # "**/name" is "name" at any depth: the unanchored form, matched on the name alone.
        return Pattern(line, negated, dir_only, False, tuple(segments[1:]))
    return Pattern(line, negated, dir_only, anchored, tuple(segments))


def _trim_trailing_spaces(line: str) -> str:
    # git's trim_trailing_spaces: trailing spaces go unless escaped ("\ " keeps one).
    last_space = -1
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == " ":
            if last_space < 0:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= n:
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


# -- a list of patterns --------------------------------------------------------------------------


class _Block:
    """Consecutive patterns of one polarity: their order among themselves does not matter
    (any match gives the same answer), so plain names are one set lookup, ``*.ext`` one
    ``endswith`` and literal anchored paths one set lookup, whatever their number."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        names: set[str] = set()
        suffixes: list[str] = []
        exact: set[str] = set()
        inner: set[str] = set()
        rest: list[Pattern] = []
        for p in patterns:
            shape = _simple_shape(p)
            if shape is None:
                rest.append(p)
            elif shape[0] == "name":
                names.add(shape[1])
            elif shape[0] == "suffix":
                suffixes.append(shape[1])
            elif shape[0] == "path":
                exact.add(shape[1])
            else:
                inner.add(shape[1])
        self.names = frozenset(names)
        self.suffixes = tuple(suffixes)
        self.exact = frozenset(exact)
        self.inner = frozenset(inner)
        self.rest = tuple(rest)

    def hit(self, rel: str, is_dir: bool) -> bool:
        head, _, name = rel.rpartition("/")
        if name in self.names or rel in self.exact:
            return True
        if self.suffixes and name.endswith(self.suffixes):
            return True
        if self.inner and head and not self.inner.isdisjoint(head.split("/")):
            return True
        if self.rest:
            parts = rel.split("/")
            return any(p.matches(parts, is_dir) for p in self.rest)
        return False


class PatternList:
    """The patterns of one source (the spec's ``excludes``, or one ``.gitignore``), in order:
    the last pattern that matches a path decides."""

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self.patterns = tuple(patterns)
        #: Whether any pattern can match a file (not only directories).
        self.files_too = any(not p.dir_only for p in self.patterns)
        # Per kind of path (file, directory): blocks of one polarity, last block first.
        self._blocks: dict[bool, tuple[tuple[bool, _Block], ...]] = {}
        for is_dir in (False, True):
            runs: list[tuple[bool, list[Pattern]]] = []
            for p in self.patterns:
                if p.never or (p.dir_only and not is_dir):
                    continue
                if runs and runs[-1][0] == p.negated:
                    runs[-1][1].append(p)
                else:
                    runs.append((p.negated, [p]))
            self._blocks[is_dir] = tuple((not neg, _Block(ps)) for neg, ps in reversed(runs))

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> PatternList:
        return cls(p for p in map(compile_pattern, lines) if p is not None)

    def __len__(self) -> int:
        return len(self.patterns)

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True if ``rel`` (relative to this list's base, ``/``-separated) is excluded, False
        if a ``!`` pattern re-includes it, None if no pattern matches it."""
        for excluded, block in self._blocks[is_dir]:
            if block.hit(rel, is_dir):
                return excluded
        return None

    def match(self, rel: str, is_dir: bool = False) -> bool:
        return self.decide(rel, is_dir) is True


def _simple_shape(p: Pattern) -> tuple[str, str] | None:
    """``("name", n)`` for an unanchored literal name, ``("suffix", s)`` for ``*s``,
    ``("path", rel)`` for an anchored path without wildcards."""
    if p.anchored:
        segs = p.segments
        if all(s is not None and s.chunks is not None and len(s.chunks) == 1 for s in segs):
            return ("path", "/".join(s.chunks[0] for s in segs if s and s.chunks))
        if (
            len(segs) == 4
            and segs[0] is None
            and segs[3] is None
            and segs[1] is not None
            and segs[1].chunks is not None
            and len(segs[1].chunks) == 1
            and segs[2] == Segment(("", ""))
        ):
            return ("inner", segs[1].chunks[0])  # "**/name/**": below a directory "name"
        return None
    if len(p.segments) != 1 or p.segments[0] is None:
        return None
    chunks = p.segments[0].chunks
    if chunks is None:
        return None
    if len(chunks) == 1:
        return ("name", chunks[0])
    if len(chunks) == 2 and chunks[0] == "" and chunks[1]:
        return ("suffix", chunks[1])
    return None


def check_list(lines: Sequence[str], what: str) -> None:
    """``PatternError`` if ``lines`` is past the bounds (``what`` names the source)."""
    if len(lines) > MAX_PATTERNS:
        raise PatternError(f"{what}: {len(lines)} patterns, more than {MAX_PATTERNS}")
    for line in lines:
        if len(line) > MAX_PATTERN_CHARS:
            raise PatternError(
                f"{what}: a pattern of {len(line)} characters, longer than {MAX_PATTERN_CHARS}"
            )
