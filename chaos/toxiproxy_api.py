"""The Toxiproxy HTTP API, on asyncio, over the proxies of ``fault_proxy.py`` (``twinflow proxy``).

The routes and status codes are Toxiproxy's, so its clients (the product
uses ``toxiproxy-python``) drive this server as they would drive Toxiproxy:

======  =================================  ==========================================  =======
method  path                               does                                        answers
======  =================================  ==========================================  =======
GET     /version                           ``{"version": ...}``                        200
GET     /proxies                           every proxy, by name                        200
POST    /proxies                           create (listen port 0: resolved)            201, 409
POST    /populate                          create or replace a list of proxies         201
POST    /reset                             enable every proxy, remove every toxic      204
GET     /proxies/{p}                       one proxy                                   200, 404
POST    /proxies/{p}                       update enabled, listen, upstream            200, 404
DELETE  /proxies/{p}                       delete (closes its connections)             204, 404
GET     /proxies/{p}/toxics                the proxy's toxics                          200, 404
POST    /proxies/{p}/toxics                add a toxic                                 200, 409
GET     /proxies/{p}/toxics/{t}            one toxic                                   200, 404
POST    /proxies/{p}/toxics/{t}            update its attributes, toxicity or stream   200, 404
DELETE  /proxies/{p}/toxics/{t}            remove it                                   204, 404
======  =================================  ==========================================  =======

A malformed request or toxic answers 400, and an address that cannot be
bound answers 500, each with ``{"error": reason, "status": code}``. The
server speaks HTTP/1.1 with keep-alive (clients reuse connections), binds
127.0.0.1:8474 by default and handles one request at a time per
connection; every proxy runs on the same loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from .fault_proxy import Proxy
from .toxics import BadToxic, parse_toxic

log = logging.getLogger("twinflow.toxiproxy_api")

VERSION = "2.12.0-twinflow"  # the Toxiproxy API version this server follows
MAX_BODY = 1 << 20
REASONS = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error"}


class ApiError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class ToxiproxyServer:
    """The proxies and the HTTP API that manages them."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474):
        self.host, self.port = host, port
        self.proxies: dict[str, Proxy] = {}
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Serve the API; returns the port (0 is resolved)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- HTTP -------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except ApiError as exc:
                    _write_response(writer, exc.status, {"error": exc.reason, "status": exc.status}, False)
                    await writer.drain()
                    return
                if request is None:
                    return
                method, path, body, keep_alive = request
                try:
                    status, payload = await self.handle(method, path, body)
                except ApiError as exc:
                    status, payload = exc.status, {"error": exc.reason, "status": exc.status}
                except Exception as exc:  # a bug must answer 500, not kill the API
                    log.exception("%s %s failed", method, path)
                    status, payload = 500, {"error": f"{type(exc).__name__}: {exc}", "status": 500}
                _write_response(writer, status, payload, keep_alive)
                await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """Route one request; returns (status, JSON payload or None)."""
        parts = [p for p in path.split("?")[0].split("/") if p]
        if parts == ["version"] and method == "GET":
            return 200, {"version": VERSION}
        if parts == ["reset"] and method == "POST":
            for proxy in self.proxies.values():
                proxy.clear_toxics()
                if not proxy.enabled:
                    await self._listen(proxy)
            return 204, None
        if parts == ["populate"] and method == "POST":
            return 201, {"proxies": [p.to_json() for p in await self._populate(body)]}
        if parts == ["proxies"]:
            if method == "GET":
                return 200, {name: p.to_json() for name, p in self.proxies.items()}
            if method == "POST":
                return 201, (await self._create(body)).to_json()
        if len(parts) == 2 and parts[0] == "proxies":
            proxy = self._proxy(parts[1])
            if method == "GET":
                return 200, proxy.to_json()
            if method in ("POST", "PATCH"):
                return 200, (await self._update(proxy, body)).to_json()
            if method == "DELETE":
                await proxy.stop()
                del self.proxies[proxy.name]
                return 204, None
        if len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
            proxy = self._proxy(parts[1])
            if method == "GET":
                return 200, [t.to_json() for _, t in proxy.toxics.values()]
            if method == "POST":
                toxic = _toxic(body)
                if toxic.name in proxy.toxics:
                    raise ApiError(409, f"toxic already exists: {toxic.name}")
                proxy.set_toxic(toxic)
                return 200, toxic.to_json()
        if len(parts) == 4 and parts[0] == "proxies" and parts[2] == "toxics":
            proxy = self._proxy(parts[1])
            if parts[3] not in proxy.toxics:
                raise ApiError(404, f"toxic not found: {parts[3]}")
            _, toxic = proxy.toxics[parts[3]]
            if method == "GET":
                return 200, toxic.to_json()
            if method in ("POST", "PATCH"):
                try:
                    changed = toxic.updated(_object(body))
                except BadToxic as exc:
                    raise ApiError(400, str(exc)) from None
                proxy.set_toxic(changed)
                return 200, changed.to_json()
            if method == "DELETE":
                proxy.remove_toxic(toxic.name)
                return 204, None
        if parts and parts[0] in ("proxies", "version", "reset", "populate"):
            raise ApiError(405, f"{method} is not allowed on {path}")
        raise ApiError(404, f"no such route: {path}")

    # -- proxies ----------------------------------------------------------
    def _proxy(self, name: str) -> Proxy:
        if name not in self.proxies:
            raise ApiError(404, f"proxy not found: {name}")
        return self.proxies[name]

    async def _create(self, body: Any) -> Proxy:
        body = _object(body)
        name, upstream = body.get("name"), body.get("upstream")
        if not isinstance(name, str) or not name or not isinstance(upstream, str):
            raise ApiError(400, "a proxy needs a name and an upstream (host:port)")
        if name in self.proxies:
            raise ApiError(409, f"proxy already exists: {name}")
        try:
            proxy = Proxy(name, body.get("listen") or "127.0.0.1:0", upstream)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if body.get("enabled", True):
            await self._listen(proxy)
        else:
            proxy.enabled = False
        self.proxies[name] = proxy
        return proxy

    async def _update(self, proxy: Proxy, body: Any) -> Proxy:
        body = _object(body)
        listen, upstream = body.get("listen", proxy.listen), body.get("upstream", proxy.upstream)
        enabled = body.get("enabled", proxy.enabled)
        if not isinstance(enabled, bool):
            raise ApiError(400, f"enabled: must be true or false (got {enabled!r})")
        moved = listen != proxy.listen or upstream != proxy.upstream
        if proxy.enabled and (moved or not enabled):
            await proxy.stop()
        try:
            proxy.listen, proxy.upstream = listen, upstream
            Proxy(proxy.name, listen, upstream)  # validates both addresses
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        if enabled and not proxy.enabled:
            await self._listen(proxy)
        return proxy

    async def _populate(self, body: Any) -> list[Proxy]:
        if not isinstance(body, list):
            raise ApiError(400, "populate takes a JSON list of proxies")
        out = []
        for item in body:
            item = _object(item)
            existing = self.proxies.get(item.get("name"))
            if existing is not None and (existing.upstream != item.get("upstream")
                                         or item.get("listen") not in (None, existing.listen)):
                await existing.stop()
                del self.proxies[existing.name]
                existing = None
            out.append(existing if existing is not None else await self._create(item))
        return out

    async def _listen(self, proxy: Proxy) -> None:
        try:
            await proxy.start()
        except OSError as exc:
            raise ApiError(500, f"listen {proxy.listen}: {exc.strerror or exc}") from None


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _toxic(body: Any):
    try:
        return parse_toxic(body)
    except BadToxic as exc:
        raise ApiError(400, str(exc)) from None


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, Any, bool] | None:
    """(method, path, JSON body or None, keep-alive) of the next request; None at the end."""
    line = await reader.readline()
    if not line:
        return None
    try:
        method, path, version = line.decode("latin-1").split()
    except ValueError:
        raise ApiError(400, "malformed request line") from None
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        key, _, value = h.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise ApiError(400, "request body too large")
    raw = await reader.readexactly(length) if length else b""
    keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    if not raw.strip():
        return method, path, None, keep_alive
    try:
        return method, path, json.loads(raw), keep_alive
    except json.JSONDecodeError as exc:
        return method, path, _BadJson(str(exc)), keep_alive


class _BadJson:
    """A body that is not JSON: every route that reads one answers 400."""

    def __init__(self, reason: str):
        self.reason = reason


def _write_response(writer: asyncio.StreamWriter, status: int, payload: Any, keep_alive: bool) -> None:
    body = b"" if payload is None else json.dumps(payload).encode()
    head = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", f"Content-Length: {len(body)}",
            "Connection: " + ("keep-alive" if keep_alive else "close")]
    if payload is not None:
        head.append("Content-Type: application/json")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def serve_forever(host: str = "127.0.0.1", port: int = 8474, ready=None) -> None:
    """Run the server until interrupted (``twinflow proxy``); ``ready(port)`` once it listens."""

    async def main() -> None:
        server = ToxiproxyServer(host, port)
        bound = await server.start()
        log.info("Toxiproxy-compatible API on %s:%d", host, bound)
        if ready is not None:
            ready(bound)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    asyncio.run(main())
