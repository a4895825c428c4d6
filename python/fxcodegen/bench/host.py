"""What the bench records about the machine it runs on.

- :func:`machine`: CPU, cores, memory, Python, torch and the compiled core's build, written at
  the top of the JSON results.
- :func:`page_cost_us`: what a fresh and a resident 4 KiB page cost right now, probed before
  and after each row's timed runs.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import statistics
import time
from typing import Any

import torch

from fxcodegen.bench.impls import fxcodegen_error

__all__ = ["machine", "page_cost_us"]


def page_cost_us(mib: int = 16, repeat: int = 3) -> dict[str, float] | None:
    """What writing a 4 KiB page costs now, in µs (medians of ``repeat`` probes of ``mib``
    MiB): ``fresh`` for a page first touched (the kernel finding, zeroing and mapping it, on
    top of the write), ``resident`` for one written again. Large graphs write tens of MB of
    fresh memory per call, and on a VM a fresh page can cost from a few to tens of µs, moving
    from minute to minute. None where the probe cannot run."""
    fresh: list[float] = []
    resident: list[float] = []
    n = mib << 20
    pages = n // 4096
    for _ in range(repeat):
        try:
            m = mmap.mmap(-1, n)
        except (OSError, ValueError):  # pragma: no cover
            return None
        try:
            view = ctypes.c_char.from_buffer(m)
            addr = ctypes.addressof(view)
            t0 = time.perf_counter()
            ctypes.memset(addr, 1, n)
            t1 = time.perf_counter()
            ctypes.memset(addr, 2, n)
            t2 = time.perf_counter()
            del view
        finally:
            m.close()
        resident.append((t2 - t1) / pages * 1e6)
        fresh.append((t1 - t0) / pages * 1e6 - resident[-1])
    return {"fresh": statistics.median(fresh), "resident": statistics.median(resident)}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover
        mem = None
    info = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    if fxcodegen_error() is None:
        import fxcodegen
        from fxcodegen import _core

        info["fxcodegen"] = fxcodegen.__version__
        st = os.stat(_core.__file__)
        info["core"] = {
            "file": os.path.basename(_core.__file__),
            "bytes": st.st_size,
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime)),
            # Set by the core if it says how it was built (not every build does).
            "debug_assertions": getattr(_core, "__debug_build__", None),
        }
    return info
