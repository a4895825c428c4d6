"""A small misbehaving RESP server for the remote-store fault tests (not collected).

``FakeRedis(reply)`` listens on a free loopback port; each command a client sends (a list
of ``bytes``, the command name upper-cased) goes to ``reply(args, send)``, which answers
through ``send(bytes)`` however slowly or wrongly it likes. Connection set-up commands
(``CLIENT``, ``SELECT``) get ``+OK``; ``HELLO`` gets an error, as from a server older than
Redis 6, so the client speaks RESP2.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

Reply = Callable[[list[bytes], Callable[[bytes], None]], None]


class FakeRedis:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.commands: list[list[bytes]] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._conns: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while not self._closed.is_set():
                line = f.readline()
                if not line.startswith(b"*"):
                    return
                args = []
                for _ in range(int(line[1:])):
                    n = int(f.readline()[1:])
                    args.append(f.read(n + 2)[:n])
                args[0] = args[0].upper()
                self.commands.append(args)
                if args[0] == b"HELLO":  # as a server before Redis 6: the client falls back
                    conn.sendall(b"-ERR unknown command 'HELLO'\r\n")
                    continue
                if args[0] in (b"CLIENT", b"SELECT"):
                    conn.sendall(b"+OK\r\n")
                    continue
                self.reply(args, conn.sendall)
        except (OSError, ValueError):
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
                c.close()

    def __enter__(self) -> FakeRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drip(size: int = 100_000, every_s: float = 0.05) -> Reply:
    """A GET answered with a ``size``-byte bulk reply, one byte every ``every_s``: each
    socket read returns in time, the reply never completes. PING and SCAN (one artifact's
    name) answer at once."""

    name = b"fxcg:v2:0123456789abcdef:art:" + b"a" * 64

    def reply(args: list[bytes], send: Callable[[bytes], None]) -> None:
        if args[0] == b"SCAN":  # one artifact, so that `cache ls` reads it
            send(b"*2\r\n$1\r\n0\r\n*1\r\n$%d\r\n%s\r\n" % (len(name), name))
            return
        if args[0] != b"GET":
            send(b"+PONG\r\n" if args[0] == b"PING" else b"+OK\r\n")
            return
        send(f"${size}\r\n".encode())
        for _ in range(size):
            time.sleep(every_s)
            send(b"x")

    return reply


def slow(delay_s: float) -> Reply:
    """Every command answered correctly for an empty store, ``delay_s`` late."""

    def reply(args: list[bytes], send: Callable[[bytes], None]) -> None:
        time.sleep(delay_s)
        cmd = args[0]
        if cmd == b"PING":
            send(b"+PONG\r\n")
        elif cmd in (b"GET",):
            send(b"$-1\r\n")
        elif cmd == b"SET":
            send(b"+OK\r\n")
        elif cmd == b"EVAL":  # the digests script: one empty digest per key
            n = int(args[2])
            send(f"*{n}\r\n".encode() + b"$0\r\n\r\n" * n)
        else:
            send(b":0\r\n")

    return reply


def wrong_types(args: list[bytes], send: Callable[[bytes], None]) -> None:
    """Every command answered with an integer (PING too)."""
    send(b":5\r\n")
