"""The headers every answer of the console's port carries, the application's and the server's own.

A refusal the server makes before the application runs (a request too long, a body without a
length, a wrong ``Host``) is as strict as the page: no cache, no sniffing, no framing, only the
console's own script and style. Nothing here can fail.
"""

from __future__ import annotations

from http import HTTPStatus

SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
)


def reason(status: int) -> str:
    """The reason phrase of ``status`` (``Error`` for one HTTP does not name)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def with_security(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with each security header it lacks added."""
    present = {name.lower() for name, _ in headers}
    return [*headers, *((n, v) for n, v in SECURITY_HEADERS if n.lower() not in present)]


def plain_answer(status: int, text: str) -> bytes:
    """A whole HTTP/1.0 answer: ``status`` with ``text`` as its body, the security headers, and the
    connection closed after it (what the server sends for a request it refuses itself).

    >>> plain_answer(408, "too slow").split(b"\\r\\n")[0]
    b'HTTP/1.0 408 Request Timeout'
    """
    body = (text.rstrip("\n") + "\n").encode("utf-8", "replace")
    head = [f"HTTP/1.0 {status} {reason(status)}", "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}", "Connection: close",
            *(f"{name}: {value}" for name, value in SECURITY_HEADERS)]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
