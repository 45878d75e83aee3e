"""Matching one path component of a gitignore-style pattern, without regular expressions.

Who calls it: ``spec.patterns`` only (``compile_pattern`` tokenizes a pattern here and
builds its ``Segment``s; ``Pattern.matches`` runs them). What it owns: a pattern's tokens
(literal characters, ``?``, ``*``, ``/`` and ``[...]`` classes, as git's ``wildmatch.c``
reads them), and the match of one component: string operations for literal chunks between
stars, else a bit-parallel NFA (shift-and). Nothing backtracks (``patterns``' docstring says
why that matters).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# -- one character ------------------------------------------------------------------------

#: ``[:name:]`` classes, ASCII only (git's own ctype: no locale).
_CLASSES: dict[str, Callable[[str], bool]] = {
    "alnum": lambda c: c.isascii() and c.isalnum(),
    "alpha": lambda c: c.isascii() and c.isalpha(),
    "blank": lambda c: c in " \t",
    "cntrl": lambda c: ord(c) < 32 or ord(c) == 127,
    "digit": lambda c: "0" <= c <= "9",
    "graph": lambda c: 33 <= ord(c) <= 126,
    "lower": lambda c: "a" <= c <= "z",
    "print": lambda c: 32 <= ord(c) <= 126,
    "punct": lambda c: 33 <= ord(c) <= 126 and not c.isalnum(),
    "space": lambda c: c in " \t\n\r",
    "upper": lambda c: "A" <= c <= "Z",
    "xdigit": lambda c: c in "0123456789abcdefABCDEF",
}


@dataclass(frozen=True)
class _Class:
    """``[...]``: characters, ranges and named classes, maybe negated."""

    negated: bool
    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]
    named: tuple[str, ...]

    def matches(self, c: str) -> bool:
        found = (
            c in self.chars
            or any(lo <= c <= hi for lo, hi in self.ranges)
            or any(_CLASSES[n](c) for n in self.named)
        )
        return found != self.negated


_ANY = "?"  # one character
STAR = "*"  # any run of characters (within one path component)
SEP = "/"
#: A token: a literal character (``("lit", c)``), ``_ANY``, ``STAR``, ``SEP`` or a ``_Class``.
Token = tuple[str, str] | str | _Class


class Never(Exception):
    """The pattern can match nothing (an unclosed ``[``, a bad ``[:class:]``, a trailing
    ``\\``): git's wildmatch aborts on these."""


def _parse_class(text: str, i: int) -> tuple[_Class, int]:
    """The class starting after the ``[`` at ``text[i - 1]``; (class, index after ``]``).

    A port of wildmatch.c's loop: the first character (after ``!``/``^``) is taken even if
    it is ``]``; ``a-z`` is a range unless ``-`` is first or last; ``\\`` escapes."""
    n = len(text)
    negated = False
    if i < n and text[i] in "!^":
        negated = True
        i += 1
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    named: list[str] = []
    prev = ""
    first = True
    while True:
        if i >= n:
            raise Never
        c = text[i]
        if c == "]" and not first:
            return _Class(negated, frozenset(chars), tuple(ranges), tuple(named)), i + 1
        first = False
        if c == "\\":
            i += 1
            if i >= n:
                raise Never
            c = text[i]
            chars.add(c)
            prev = c
        elif c == "-" and prev and i + 1 < n and text[i + 1] != "]":
            i += 1
            hi = text[i]
            if hi == "\\":
                i += 1
                if i >= n:
                    raise Never
                hi = text[i]
            ranges.append((prev, hi))
            prev = ""
        elif c == "[" and i + 1 < n and text[i + 1] == ":":
            end = text.find("]", i + 2)
            if end < 0:
                raise Never
            body = text[i + 2 : end]
            if not body.endswith(":") or len(body) < 1:
                chars.add("[")  # no ":]": a plain "[" in the set
                prev = "["
            else:
                name = body[:-1]
                if name not in _CLASSES:
                    raise Never
                named.append(name)
                prev = ""
                i = end
        else:
            chars.add(c)
            prev = c
        i += 1


def tokenize(text: str) -> list[Token]:
    """The pattern's tokens; ``Never`` if it cannot match anything."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 1
            if i >= n:
                raise Never
            c = text[i]
            out.append(SEP if c == "/" else ("lit", c))
        elif c == "*":
            out.append(STAR)
        elif c == "?":
            out.append(_ANY)
        elif c == "[":
            cls, i = _parse_class(text, i + 1)
            out.append(cls)
            continue
        elif c == "/":
            out.append(SEP)
        else:
            out.append(("lit", c))
        i += 1
    return out


# -- one path component ----------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A glob for one path component (no ``/``)."""

    #: Literal chunks between stars, when every token is a literal or a star.
    chunks: tuple[str, ...] | None
    #: Otherwise: the tokens, stars collapsed, for the NFA.
    tokens: tuple[Token, ...] = ()
    _star_bits: int = 0
    _masks: dict[str, int] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def of(cls, tokens: Sequence[Token]) -> Segment:
        collapsed: list[Token] = []
        for token in tokens:
            if token == STAR and collapsed and collapsed[-1] == STAR:
                continue  # "**" inside a component is "*"
            collapsed.append(token)
        if all(t == STAR or isinstance(t, tuple) for t in collapsed):
            chunks = [""]
            for token in collapsed:
                if token == STAR:
                    chunks.append("")
                else:
                    assert isinstance(token, tuple)
                    chunks[-1] += token[1]
            return cls(tuple(chunks))
        star_bits = sum(1 << i for i, t in enumerate(collapsed) if t == STAR)
        return cls(None, tuple(collapsed), star_bits)

    def match(self, name: str) -> bool:
        chunks = self.chunks
        if chunks is not None:
            if len(chunks) == 1:
                return name == chunks[0]
            head, tail = chunks[0], chunks[-1]
            if len(name) < len(head) + len(tail):
                return False
            if not (name.startswith(head) and name.endswith(tail)):
                return False
            pos, end = len(head), len(name) - len(tail)
            for chunk in chunks[1:-1]:
                found = name.find(chunk, pos, end)
                if found < 0:
                    return False
                pos = found + len(chunk)
            return True
        return self._nfa(name)

    def _nfa(self, name: str) -> bool:
        # Bit i: the first i tokens matched. A character moves bit i to i+1 when token i
        # accepts it, and keeps bit i when token i is a star; a star may also match nothing
        # (bit i+1 follows bit i). Stars are never adjacent, so one closure step suffices.
        stars = self._star_bits
        state = 1 | ((1 & stars) << 1)
        for c in name:
            mask = self._masks.get(c)
            if mask is None:
                mask = self._mask(c)
            state = ((state & mask) << 1) | (state & stars)
            state |= (state & stars) << 1
            if not state:
                return False
        return bool(state >> len(self.tokens) & 1)

    def _mask(self, c: str) -> int:
        mask = 0
        for i, token in enumerate(self.tokens):
            if token == _ANY:
                hit = True
            elif isinstance(token, tuple):
                hit = token[1] == c
            elif isinstance(token, _Class):
                hit = token.matches(c)
            else:
                hit = False
            if hit:
                mask |= 1 << i
        if len(self._masks) < 4096:
            self._masks[c] = mask
        return mask


GLOBSTAR = None  # a "**" component: any number of components
