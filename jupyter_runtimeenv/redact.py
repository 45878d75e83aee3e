"""URLs as logs, events and errors show them: without user info, query or fragment.

Who calls it: ``errors`` (every ``SpecError`` reason, every ``BuildError`` message and output
tail), the agent's build log (every line an installer prints, every step name and label),
``plugins._remote`` and ``plugins._fetch`` (the URLs they name). A presigned URL's
signature (``?X-Amz-Signature=...``), a token in a query (``?token=...``) or a password
(``https://user:secret@host``) never reaches a log file, an event, an error or a REST answer;
what stays (scheme, host, path) is enough to tell which URL it was. The spec itself keeps
the URL whole (it is what was asked for; the index that stores it is owner-only).

The pattern that finds URLs in text has no nested quantifier (a scheme, ``://``, then a run
of characters that are not spaces, quotes or brackets), so finding them is linear in the
text.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["redact_text", "redact_url"]

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s'\"<>()\[\]{}]*")


def redact_url(url: str) -> str:
    """``url`` without user info, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url.split("?", 1)[0].split("#", 1)[0]
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
