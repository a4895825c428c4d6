"""Peak extra memory of one implementation's run, measured in a fresh process.

:func:`peak_memory` runs ``python -m fxcodegen.bench.peak_rss memory SHAPE SIZE IMPL``, which
builds the workload, warms the implementation up on a small graph, hands freed memory back,
resets the RSS high-water mark (``VmHWM``) through ``/proc/self/clear_refs`` and makes the one
call, then prints one JSON line. Reading the RSS, rather than ``tracemalloc``, counts the Rust
core's allocations too. Linux only: elsewhere :func:`peak_memory` returns None.

:func:`status_kb`, :func:`trim` and :func:`reset_peak` are the process-side steps, for scripts
in ``benches/`` that measure other calls the same way.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
from typing import Any

from fxcodegen.bench import workloads
from fxcodegen.bench.impls import implementation

__all__ = ["main", "peak_memory", "reset_peak", "status_kb", "trim"]

_USAGE = "usage: python -m fxcodegen.bench.peak_rss memory SHAPE SIZE IMPL"


def status_kb(key: str) -> int:
    """``key``'s KiB figure (``VmRSS``, ``VmHWM``, ``RssAnon``...) in ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def trim() -> None:
    """Collects garbage and hands the allocator's free memory back to the kernel."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def reset_peak() -> int:
    """Hands freed memory back and resets the RSS high-water mark (``VmHWM``) to the RSS, which it
    returns in KiB: what a call's peak extra memory is measured from."""
    trim()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    return status_kb("VmRSS")


def _measure(shape: str, size: int, impl: str) -> dict[str, Any]:
    fn = implementation(impl)
    fn(workloads.build(shape, 16 if shape != "model" else 1).gm)  # warm caches
    wl = workloads.build(shape, size)
    before = reset_peak()
    result = fn(wl.gm)
    peak = status_kb("VmHWM")
    code = result[0] if isinstance(result, tuple) else None
    return {
        "shape": shape,
        "size": size,
        "impl": impl,
        "nodes": wl.num_nodes,
        "rss_before_kb": before,
        "peak_extra_bytes": (peak - before) * 1024,
        "source_bytes": len(code.encode()) if isinstance(code, str) else None,
    }


def peak_memory(shape: str, size: int, impl: str, timeout: float = 1800) -> dict[str, Any] | None:
    """Peak extra RSS of one ``impl`` run on a fresh process, or None where it cannot be read."""
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    cmd = [sys.executable, "-m", "fxcodegen.bench.peak_rss", "memory", shape, str(size), impl]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """The child's entry point: ``memory SHAPE SIZE IMPL`` prints one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "memory":
        print(_USAGE, file=sys.stderr)
        return 1
    print(json.dumps(_measure(args[1], int(args[2]), args[3])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
