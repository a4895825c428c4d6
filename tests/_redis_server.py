"""A real ``redis-server`` on a free loopback port, for the remote-store tests (not collected).

``make test`` installs the server (``make redis``); the tests start and kill their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process: no persistence, loopback only."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed: run `make redis`")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        log = open(workdir / f"redis-{self.port}.log", "w")  # closed in stop
        self._log = log
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (exit {self.proc.poll()})")
            time.sleep(0.05)

    def client(self):  # redis.Redis
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def pause(self) -> None:
        """Stop the server without closing its sockets: a Redis that answers nothing."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


def serve(workdir: Path) -> Iterator[RedisServer]:
    """For a fixture: ``yield from serve(tmp_path)`` starts a server and kills it after."""
    server = RedisServer(workdir)
    try:
        yield server
    finally:
        server.kill()
