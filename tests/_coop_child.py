"""A child process for the cooperative-compile tests (not collected): no Inductor.

``python _coop_child.py CONFIG_JSON`` runs :meth:`fxcodegen.cache.coop.Coop.gather` over
``n`` stand-in entries whose "compile" sleeps ``compile_s`` and returns bytes derived from
the entry, and prints one ``RESULT`` JSON line: the entries compiled here, those received,
the SHA-256 of every entry's bytes, the counters and the warnings logged.

Config: ``cache_dir``, ``n``, ``compile_s``, optional ``remote`` (URL), ``secret``,
``claim_ttl``, ``wait_s``, ``go`` (a file to wait for), ``ready`` (a file written when
ready), ``hold`` (claim the first ``hold`` entries, write ``ready`` and sleep until killed:
a claimer that dies mid-compile).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time

from _child_io import Collect, ready_then_go, write_ready


def entry_key(i: int) -> str:
    return hashlib.sha256(f"entry {i}".encode()).hexdigest()


def entry_bytes(i: int) -> bytes:
    return f"compiled entry {i};".encode() * 50


def main() -> int:
    cfg = json.loads(sys.argv[1])
    from fxcodegen.cache import Cache
    from fxcodegen.cache.coop import Coop, Work
    from fxcodegen.cache.remote import open_remote
    from fxcodegen.obtain import count, counters

    collect = Collect.install()
    remote = open_remote(cfg.get("remote"), cfg.get("secret"), claim_ttl=cfg.get("claim_ttl"))
    coop = Coop(Cache(cfg["cache_dir"]), remote, wait_s=cfg.get("wait_s"), poll_s=0.05, count=count)
    assert coop.cache.usable()

    def work(i: int) -> Work:
        def compile_one() -> bytes:
            counters["compile"] += 1
            time.sleep(cfg["compile_s"])
            return entry_bytes(i)

        return Work(entry_key(i), f"entry {i}", compile_one)

    if cfg.get("hold"):
        with contextlib.ExitStack() as stack:
            for i in range(cfg["hold"]):
                assert stack.enter_context(coop.claim(entry_key(i)))
            write_ready(cfg["ready"])
            time.sleep(3600)
        return 1
    ready_then_go(cfg, timeout_s=120)
    t0 = time.monotonic()
    others, mine = coop.gather([work(i) for i in range(cfg["n"])])
    elapsed = time.monotonic() - t0
    got = {k: hashlib.sha256(v).hexdigest() for k, v in others.items()}
    for i in range(cfg["n"]):
        if entry_key(i) in mine:
            got[entry_key(i)] = hashlib.sha256(entry_bytes(i)).hexdigest()
    result = {
        "mine": sorted(mine),
        "others": sorted(others),
        "sha": got,
        "elapsed": elapsed,
        "counters": dict(counters),
    }
    collect.report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
