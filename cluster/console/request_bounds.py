"""How much of a connection's bytes make one request, within the console's bounds: :func:`examine`.

The server reads a request whole before the application sees it; this decides, from the bytes
received so far, whether more are needed, how many bytes the request is, or why it is refused:

- a request line longer than ``max_line``: 414; a head (the line and the headers) longer than
  ``max_head``, or with more than ``max_headers`` headers: 431;
- a body is taken only with one ``Content-Length`` that is a number of bytes, at most ``max_body``:
  a length that is negative, not a number, or given twice differently is 400, one too large 413;
  a body sent ``chunked`` (any ``Transfer-Encoding``), or a POST without a length, 411. A request
  without a length has no body: bytes after its head are never read as one.

It never raises, whatever the bytes are.

>>> b = Bounds()
>>> examine(b"GET /console/ HTTP/1.1\\r\\nHost: x\\r\\n", b)
>>> examine(b"GET /console/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n", b)
35
>>> examine(b"POST /a HTTP/1.1\\r\\nContent-Length: 2\\r\\n\\r\\n{}", b)
41
>>> examine(b"POST /a HTTP/1.1\\r\\nContent-Length: -1\\r\\n\\r\\n", b).status
400
>>> examine(b"POST /a HTTP/1.1\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n", b).status
411
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_END = re.compile(rb"\r?\n\r?\n")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_BODY_METHODS = (b"POST", b"PUT", b"PATCH")


@dataclass(frozen=True)
class Bounds:
    """What one request may be: its line, its head, its headers and its body, in bytes."""

    max_line: int = 8 << 10
    max_head: int = 32 << 10
    max_headers: int = 100
    max_body: int = 1 << 20


@dataclass(frozen=True)
class Refusal:
    """A request refused before the application sees it: the HTTP ``status`` and why."""

    status: int
    why: str


def examine(data: bytes, bounds: Bounds) -> int | Refusal | None:
    """The length of the request at the start of ``data`` when it is all there, a :class:`Refusal`,
    or None while more bytes are needed (see the module doc)."""
    end = _END.search(data, 0, bounds.max_head + 4)
    first = data.find(b"\n", 0, bounds.max_line + 2)
    if first < 0 and len(data) > bounds.max_line:
        return Refusal(414, f"the request line is longer than {bounds.max_line} bytes")
    if end is None:
        if len(data) > bounds.max_head:
            return Refusal(431, f"the request's head is longer than {bounds.max_head} bytes")
        return None
    if first > bounds.max_line:
        return Refusal(414, f"the request line is longer than {bounds.max_line} bytes")
    head = data[:end.start()]
    lines = head.split(b"\n")
    method = lines[0].split(b" ", 1)[0]
    if len(lines) - 1 > bounds.max_headers:
        return Refusal(431, f"the request has more than {bounds.max_headers} headers")
    lengths, coded = set(), False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            lengths.add(value.strip())
        elif name == b"transfer-encoding":
            coded = True
    if coded:
        return Refusal(411, "send the body with a Content-Length: a chunked body (any Transfer-Encoding) is not taken")
    if not lengths:
        if method in _BODY_METHODS:
            return Refusal(411, f"a {method.decode('latin-1')} needs a Content-Length")
        return end.end()
    if len(lengths) > 1:
        return Refusal(400, "the request gives Content-Length more than once, differently")
    (text,) = lengths
    if not _DIGITS.fullmatch(text):
        return Refusal(400, f"Content-Length must be a number of bytes, not {text[:20].decode('latin-1')!r}")
    size = int(text)
    if size > bounds.max_body:
        return Refusal(413, f"the body is {size} bytes; at most {bounds.max_body} are taken")
    if len(data) < end.end() + size:
        return None
    return end.end() + size
