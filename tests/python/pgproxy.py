"""A TCP proxy in front of PostgreSQL that can cut a connection around COMMIT.

It relays bytes both ways and parses the client's side of the protocol (a startup message
without a type byte, then typed messages: one type byte and a 4-byte length). When armed,
the first simple-query message that is exactly COMMIT triggers the cut (or, armed with a
``statement``, the first Bind of that prepared statement: a statement run in autocommit
commits at its Sync, so that is its COMMIT; or, armed with a ``query``, the first Parse
whose SQL text holds it, as for the unnamed statements of the Citus layout and of pooled
connections):

- ``"after"``: COMMIT is forwarded, the proxy waits until the server has answered it
  (so the transaction did commit), and then drops both sides without relaying the answer.
- ``"before"``: both sides are dropped and COMMIT never reaches the server, which rolls
  the transaction back.

Either way the client cannot know which happened: that is an in-doubt commit.

Armed ``"stalled"``, the proxy instead cuts the first connection whose server has not
answered a Sync or a simple query within ``stall`` seconds: a statement waiting for a row
lock. The statement keeps running on the server (PostgreSQL does not notice a dead client
while it waits), which is the case where a careless client looks for its write too early.

``freeze()`` stops relaying both ways without closing anything, as a server that stopped
answering (or a network that drops packets) looks from the client; new connections are
accepted but get no answer either. ``thaw()`` relays what was held back, and more.

Connect with ``sslmode=disable`` so that the stream is plain protocol.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import List, Optional


class CommitCuttingProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed: Optional[str] = None
        self._statement: Optional[bytes] = None
        self._query: Optional[bytes] = None
        self._stall = 0.0
        self._links: List[_Link] = []
        self.cuts = 0
        # While set, new connections are accepted and closed at once (the server seems down).
        self.refuse_new = False
        self._closed = False
        self._released = threading.Event()  # set by release()
        self._flowing = threading.Event()  # cleared while frozen
        self._flowing.set()
        self._sockets: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(
        self,
        mode: str,
        statement: Optional[str] = None,
        stall: float = 0.3,
        query: Optional[str] = None,
    ) -> None:
        """Cuts the next connection that sends COMMIT (or binds the prepared ``statement``,
        or parses a statement whose text holds ``query``), ``"before"`` or ``"after"`` it;
        or, ``"stalled"``, the first one whose server has kept an answer waiting for
        ``stall`` seconds. ``"held"`` cuts nothing: it holds that message back until
        :meth:`release` (at most 30 s), so that a test can act between a client's
        statements. Each arm counts in ``cuts`` once taken."""
        assert mode in ("before", "after", "stalled", "held")
        with self._lock:
            self._armed = mode
            self._statement = statement.encode() if statement is not None else None
            self._query = query.encode() if query is not None else None
            self._stall = stall
        if mode == "stalled":
            threading.Thread(target=self._watch_stalls, daemon=True).start()

    def release(self) -> None:
        """Lets a message held by a ``"held"`` arm go on to the server."""
        self._released.set()

    def disarm(self) -> None:
        """Takes back an arm that has not cut yet."""
        with self._lock:
            self._armed = None

    def freeze(self) -> None:
        """Stops relaying, both ways and for new connections, without closing anything."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def _wait_flowing(self) -> None:
        while not self._flowing.wait(0.1):
            if self._closed:
                raise OSError("the proxy closed")

    def dsn(self, dbname: str, user: str = "postgres") -> str:
        return (
            f"host=127.0.0.1 port={self.port} user={user} dbname={dbname} "
            "sslmode=disable gssencmode=disable"
        )

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                _close(s)

    # --- internals ---

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse_new:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
                # It relays message by message: without this, Nagle's algorithm holds each
                # small message back for the ACK of the one before (40 ms a round trip).
                for end in (client, server):
                    end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # the server is down (restarting): the client sees a refusal
                _close(client)
                continue
            with self._lock:
                self._sockets += [client, server]
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._client_to_server, args=(link,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(link,), daemon=True).start()

    def _watch_stalls(self) -> None:
        while not self._closed:
            time.sleep(0.01)
            with self._lock:
                if self._armed != "stalled":
                    return
                now = time.monotonic()
                stalled = [
                    link
                    for link in self._links
                    if link.waiting_since is not None and now - link.waiting_since > self._stall
                ]
                if not stalled:
                    continue
                self._armed = None
                self.cuts += 1
            stalled[0].close()
            return

    def _take_arm(self, message: bytes) -> Optional[str]:
        """The armed mode if `message` triggers the cut (and disarms), else None."""
        with self._lock:
            if self._armed is None or self._armed == "stalled":
                return None
            if self._query is not None:  # Parse: statement name, then its text
                fields = message[5:].split(b"\0", 2)
                if message[:1] != b"P" or len(fields) < 2 or self._query not in fields[1]:
                    return None
            elif self._statement is None:
                text = message[5:].rstrip(b"\0").strip().upper()
                if message[:1] != b"Q" or text != b"COMMIT":
                    return None
            else:  # Bind: portal name, then statement name, each NUL-terminated
                fields = message[5:].split(b"\0", 2)
                if message[:1] != b"B" or len(fields) < 2 or fields[1] != self._statement:
                    return None
            mode, self._armed = self._armed, None
            self.cuts += 1
            return mode

    def _client_to_server(self, link: _Link) -> None:
        buffer = b""
        started = False
        try:
            while True:
                data = link.client.recv(65536)
                if not data:
                    return
                buffer += data
                # Forward whole messages only, so that COMMIT can be held back.
                while True:
                    if not started:  # the startup message has no type byte
                        if len(buffer) < 4:
                            break
                        size = struct.unpack("!I", buffer[:4])[0]
                        if len(buffer) < size:
                            break
                        message, buffer = buffer[:size], buffer[size:]
                        started = True
                        self._wait_flowing()
                        link.server.sendall(message)
                        continue
                    if len(buffer) < 5:
                        break
                    size = struct.unpack("!I", buffer[1:5])[0]
                    if len(buffer) < 1 + size:
                        break
                    message, buffer = buffer[: 1 + size], buffer[1 + size :]
                    mode = self._take_arm(message)
                    if mode == "before":
                        return
                    if mode == "held":
                        if not self._released.wait(30):
                            return
                        self._released.clear()
                    if mode == "after":
                        link.holding.set()  # no reply may reach the client from now on
                    if message[:1] in (b"Q", b"S") and link.waiting_since is None:
                        link.waiting_since = time.monotonic()
                    self._wait_flowing()
                    link.server.sendall(message)
                    # COMMIT, or the Sync that ends an armed statement: wait until the
                    # server has answered (it committed), then drop both sides.
                    if link.holding.is_set() and message[:1] in (b"Q", b"S"):
                        link.answered.wait(10)
                        return
        except OSError:
            pass
        finally:
            link.close()

    def _server_to_client(self, link: _Link) -> None:
        held = b""
        try:
            while True:
                data = link.server.recv(65536)
                if not data:
                    return
                if link.holding.is_set():
                    # Withheld. ReadyForQuery ends the answer: the server committed.
                    held += data
                    if b"Z\x00\x00\x00\x05" in held:
                        link.answered.set()
                        return
                    continue
                if b"Z\x00\x00\x00\x05" in data:  # ReadyForQuery: the answer is complete
                    link.waiting_since = None
                self._wait_flowing()
                link.client.sendall(data)
        except OSError:
            pass
        finally:
            link.answered.set()
            link.close()


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.holding = threading.Event()
        self.answered = threading.Event()
        # When the client sent a Sync or query that the server has not answered yet.
        self.waiting_since: Optional[float] = None

    def close(self) -> None:
        _close(self.client)
        _close(self.server)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
