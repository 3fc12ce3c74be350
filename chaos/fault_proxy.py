"""The TCP side of the Toxiproxy-compatible fault proxy: proxies, their connections, toxics at work.

A :class:`Proxy` listens on ``listen``, and for each client it accepts
opens a connection to ``upstream`` and pumps bytes both ways. Each
direction (a :class:`Link`) passes every chunk through the toxics of its
stream that apply to it, looked up per chunk: a toxic added, changed or
removed acts on connections that are already open, not only on new ones.
Whether a toxic applies to a link is drawn once, from its ``toxicity``.
Disabling a proxy closes its listener and every connection through it;
enabling it listens again on the same address. While a ``cut`` toxic is set,
both directions of every connection hold their bytes, and a client accepted
meanwhile is dialled upstream only once the cut is removed.

Under failure: an upstream that refuses the connection closes the client's
at once; a side that closes or fails closes the whole connection (after a
``slow_close`` delay when one applies). Nothing here raises into the API.
Everything runs on one asyncio loop (see ``toxiproxy_api.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct

from .toxics import Toxic

log = logging.getLogger("twinflow.fault_proxy")

CHUNK = 32 * 1024
KB = 1000  # bandwidth's rate is in KB/s, as Toxiproxy counts them


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be host:port (got {address!r})")
    return host.strip("[]"), int(port)


class Link:
    """One direction of one connection: ``reader`` to ``writer``, through the ``stream``'s toxics."""

    def __init__(self, conn: "Connection", stream: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, rng: random.Random):
        self.conn, self.stream, self.reader, self.writer, self.rng = conn, stream, reader, writer, rng
        self.passed = 0                                  # bytes written so far
        self._draws: dict[tuple[str, int], bool] = {}   # (toxic name, version) -> applies
        self._timers: dict[str, asyncio.Task] = {}      # toxic name -> its pending close or reset

    def toxics(self) -> list[Toxic]:
        """The toxics of this link's stream that apply to it, in the order they were added."""
        out = []
        for version, toxic in self.conn.proxy.toxics_for(self.stream):
            key = (toxic.name, version)
            if key not in self._draws:
                self._draws[key] = self.rng.random() < toxic.toxicity
            if self._draws[key]:
                out.append(toxic)
        return out

    def toxics_changed(self) -> None:
        """Start (or cancel) the timers of the toxics that act without data: timeout and reset_peer."""
        wanted = {t.name: t for t in self.toxics() if t.type in ("timeout", "reset_peer")}
        for name in list(self._timers):
            if name not in wanted:
                self._timers.pop(name).cancel()
        for name, toxic in wanted.items():
            if name in self._timers:
                continue
            delay_s = toxic.attributes["timeout"] / 1000
            if toxic.type == "timeout" and delay_s == 0:
                continue  # data is dropped for as long as the toxic stays; the connection stays open
            self._timers[name] = asyncio.ensure_future(self._after(delay_s, reset=toxic.type == "reset_peer"))

    async def _after(self, delay_s: float, reset: bool) -> None:
        await asyncio.sleep(delay_s)
        self.conn.close(reset=reset)

    async def run(self) -> None:
        # Chunks are read (and stamped with their arrival) apart from passing them on, so a
        # latency toxic delays each chunk from its own arrival, as Toxiproxy does: a reply
        # of many chunks arrives ``latency`` late, not ``latency`` times its chunks late.
        arrived: asyncio.Queue = asyncio.Queue(maxsize=64)
        reading = asyncio.ensure_future(self._read(arrived))
        try:
            while True:
                at, data = await arrived.get()
                if not data:
                    break
                if not await self._pass(data, at):
                    return
            for toxic in self.toxics():
                if toxic.type == "slow_close":
                    await asyncio.sleep(toxic.attributes["delay"] / 1000)
        except (ConnectionError, OSError):
            pass
        finally:
            reading.cancel()
            for task in self._timers.values():
                task.cancel()
            self.conn.close()

    async def _read(self, arrived: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(CHUNK)
                await arrived.put((loop.time(), data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await arrived.put((loop.time(), b""))

    async def _pass(self, data: bytes, arrived_at: float) -> bool:
        """Send one chunk (read at loop time ``arrived_at``) through the toxics; False once
        the connection must close."""
        await self.conn.proxy.until_uncut()  # a cut holds the chunk (and those after it)
        toxics = self.toxics()
        if any(t.type == "timeout" for t in toxics):
            return True  # nothing gets through while a timeout toxic applies
        pieces = [data]
        limit = None
        due = arrived_at  # latency toxics add up, each from where the one before left the chunk
        for toxic in toxics:
            a = toxic.attributes
            if toxic.type == "latency":
                jitter = a["jitter"]
                delay_ms = a["latency"] + (self.rng.uniform(-jitter, jitter) if jitter else 0)
                due += max(0.0, delay_ms) / 1000
                await asyncio.sleep(max(0.0, due - asyncio.get_running_loop().time()))
            elif toxic.type == "limit_data":
                limit = a["bytes"] if limit is None else min(limit, a["bytes"])
            elif toxic.type == "slicer" and a["average_size"] > 0:
                pieces = self._slices(pieces, a)
        if limit is not None:
            room = max(0, int(limit) - self.passed)
            pieces = _truncate(pieces, room)
        bandwidth = [t.attributes["rate"] for t in toxics if t.type == "bandwidth" and t.attributes["rate"] > 0]
        slicer = next((t.attributes for t in toxics if t.type == "slicer" and t.attributes["average_size"] > 0), None)
        for piece in pieces:
            if bandwidth:
                await asyncio.sleep(len(piece) / (min(bandwidth) * KB))
            self.writer.write(piece)
            await self.writer.drain()
            self.passed += len(piece)
            if slicer is not None and slicer["delay"]:
                await asyncio.sleep(slicer["delay"] / 1_000_000)
        if limit is not None and self.passed >= limit:
            self.conn.close()
            return False
        return True

    def _slices(self, pieces: list[bytes], a: dict) -> list[bytes]:
        out = []
        average, variation = int(a["average_size"]), int(a["size_variation"])
        for piece in pieces:
            i = 0
            while i < len(piece):
                size = max(1, average + (self.rng.randint(-variation, variation) if variation else 0))
                out.append(piece[i:i + size])
                i += size
        return out


def _truncate(pieces: list[bytes], room: int) -> list[bytes]:
    out = []
    for piece in pieces:
        if room <= 0:
            break
        out.append(piece[:room])
        room -= len(out[-1])
    return out


class Connection:
    """A client's connection through a proxy and the proxy's connection upstream."""

    def __init__(self, proxy: "Proxy", client: tuple, upstream: tuple):
        self.proxy = proxy
        (self.c_reader, self.c_writer), (self.u_reader, self.u_writer) = client, upstream
        rng = random.Random()
        self.links = [Link(self, "upstream", self.c_reader, self.u_writer, rng),
                      Link(self, "downstream", self.u_reader, self.c_writer, rng)]
        self.closed = False

    def start(self) -> None:
        for link in self.links:
            link.toxics_changed()
            asyncio.ensure_future(link.run())

    def toxics_changed(self) -> None:
        for link in self.links:
            link.toxics_changed()

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        self.proxy.connections.discard(self)
        for writer in (self.c_writer, self.u_writer):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:  # linger 0: the close sends RST
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()


class Proxy:
    """One proxy: a listener, its connections and its toxics (see the module docstring)."""

    def __init__(self, name: str, listen: str, upstream: str, enabled: bool = True):
        split_address(listen)
        split_address(upstream)
        self.name, self.listen, self.upstream, self.enabled = name, listen, upstream, enabled
        self.toxics: dict[str, tuple[int, Toxic]] = {}  # name -> (version, toxic), in the order added
        self.connections: set[Connection] = set()
        self._uncut: asyncio.Event | None = None  # set while no cut toxic is (made on the loop)
        self.held = 0  # clients accepted during a cut, not dialled upstream yet
        self._server: asyncio.base_events.Server | None = None
        self._versions = 0

    def to_json(self) -> dict:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "toxics": [t.to_json() for _, t in self.toxics.values()]}

    # -- listening --------------------------------------------------------
    async def start(self) -> None:
        """Listen (a port 0 is resolved to the real one); OSError when the address is taken."""
        host, port = split_address(self.listen)
        self._server = await asyncio.start_server(self._accept, host, port)
        port = self._server.sockets[0].getsockname()[1]
        self.listen = f"{host}:{port}"
        self.enabled = True

    async def stop(self) -> None:
        """Stop listening and close every connection through the proxy."""
        self.enabled = False
        self._wake()  # accepts held by a cut give up
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for conn in list(self.connections):
            conn.close()

    async def until_uncut(self) -> None:
        """Return once no cut toxic is set, or the proxy stopped."""
        while self.enabled and any(t.type == "cut" for _, t in self.toxics.values()):
            if self._uncut is None:
                self._uncut = asyncio.Event()
            self._uncut.clear()
            await self._uncut.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held += 1
        try:
            await self.until_uncut()  # a client accepted during a cut is dialled upstream only after it
        finally:
            self.held -= 1
        if not self.enabled:  # stopped meanwhile
            writer.close()
            return
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.open_connection(host, port)
        except OSError as exc:
            log.info("proxy %s: upstream %s refused: %s", self.name, self.upstream, exc)
            writer.close()
            return
        if not self.enabled:  # disabled while the upstream connection opened
            writer.close()
            upstream[1].close()
            return
        conn = Connection(self, (reader, writer), upstream)
        self.connections.add(conn)
        conn.start()

    def close_connections(self, reset: bool = False) -> None:
        """Close every open connection (with RST when ``reset``); the listener stays."""
        for conn in list(self.connections):
            conn.close(reset=reset)

    # -- toxics -----------------------------------------------------------
    def toxics_for(self, stream: str) -> list[tuple[int, Toxic]]:
        return [(v, t) for v, t in self.toxics.values() if t.stream == stream]

    def set_toxic(self, toxic: Toxic) -> None:
        """Add a toxic, or replace the one of that name (a new version: toxicity is drawn again)."""
        self._versions += 1
        self.toxics[toxic.name] = (self._versions, toxic)  # a replaced one keeps its place in the order
        self._changed()

    def remove_toxic(self, name: str) -> None:
        del self.toxics[name]
        self._changed()

    def clear_toxics(self) -> None:
        self.toxics.clear()
        self._changed()

    def _changed(self) -> None:
        self._wake()
        for conn in list(self.connections):
            conn.toxics_changed()

    def _wake(self) -> None:
        if self._uncut is not None:
            self._uncut.set()  # whoever waits looks again
