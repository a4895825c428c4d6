"""What the test children share (not collected): the log they report, the start signal and
the one ``RESULT`` line they print."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any


class Collect(logging.Handler):
    """Keeps every ``fxcodegen`` record at INFO and above, installed by :meth:`install`."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelname, record.getMessage()))

    @classmethod
    def install(cls) -> Collect:
        collect = cls()
        logger = logging.getLogger("fxcodegen")
        logger.addHandler(collect)
        logger.setLevel(logging.INFO)
        return collect

    def report(self, result: dict[str, Any]) -> None:
        """Print ``result`` with the warnings and the log as the ``RESULT`` line."""
        result["warnings"] = [m for lvl, m in self.records if lvl == "WARNING"]
        result["log"] = [m for _, m in self.records]
        print("RESULT " + json.dumps(result), flush=True)


def write_ready(path: str) -> None:
    with open(path, "w") as f:
        f.write(str(os.getpid()))


def ready_then_go(cfg: dict[str, Any], timeout_s: float) -> None:
    """Write ``cfg["ready"]`` (our pid), then wait for the file ``cfg["go"]``, when given:
    children started together begin their work together."""
    if cfg.get("ready"):
        write_ready(cfg["ready"])
    if cfg.get("go"):
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(cfg["go"]) and time.monotonic() < deadline:
            time.sleep(0.01)
