"""Where one ``generate`` call's peak memory goes: every allocation of 2,000 bytes or more
(``FXC_TRACE_MIN`` sets another bound), with the RSS after it and the core function that made
it.

    python benches/alloc_trace.py stitch 1k        # shape (stitch, inline, model) and size

Builds ``benches/alloc_trace.c`` (an ``LD_PRELOAD`` shim, needs gcc) into ``target/`` and runs
itself again under it. The call is set up as the bench's peak-memory child does (a warm-up call
on a small graph, then ``malloc_trim``). The RSS shown is the anonymous RSS over the call's
start, read at each large event: the bench's figure (``VmHWM``, in a process without the shim)
also counts file pages, which the shim's unwinder touches. Python's small objects (pymalloc)
are not listed, but their pages count in the RSS.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE.parent / "target" / "alloc_trace" / "libfxc_trace.so"
# Frames of the allocator and of growing collections: the caller is the frame after them.
PLUMBING = ("alloc::", "raw_vec", "__rust_", "RawVec", "GlobalAlloc", "Vec<T", "grow", "reserve")


def build_shim() -> Path:
    src = HERE / "alloc_trace.c"
    if not SHIM.exists() or SHIM.stat().st_mtime < src.stat().st_mtime:
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["gcc", "-O2", "-shared", "-fPIC", "-o", str(SHIM), str(src)]
        subprocess.run(cmd, check=True)
    return SHIM


def symbols(module: str) -> tuple[list[int], list[str]]:
    """The module's function symbols (demangled) by address."""
    out = subprocess.run(["nm", "-C", "-n", module], capture_output=True, text=True, check=True)
    addrs, names = [], []
    for line in out.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] and parts[1] in ("t", "T"):
            addrs.append(int(parts[0], 16))
            names.append(parts[2])
    return addrs, names


def module_base(path: str) -> int:
    """Where ``path`` is mapped in this process (its lowest mapping, offset 0)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    raise RuntimeError(f"{path} is not mapped")


def caller(frames: list[int], base: int, size: int, syms: tuple[list[int], list[str]]) -> str:
    """The first frame in the core that is not allocator plumbing, with the one after it."""
    addrs, names = syms
    found = []
    for a in frames:
        if not base <= a < base + size:
            continue
        i = bisect.bisect_right(addrs, a - base) - 1
        name = names[i] if i >= 0 else "?"
        if not found and any(p in name for p in PLUMBING):
            continue
        found.append(name.replace("fxcodegen::", ""))
        if len(found) == 2:
            break
    return " < ".join(found) if found else "(outside the core)"


def main() -> None:
    from fxcodegen import _core
    from fxcodegen.bench import workloads
    from fxcodegen.bench.cli import parse_sizes
    from fxcodegen.bench.impls import implementation
    from fxcodegen.bench.peak_rss import status_kb, trim

    shape = sys.argv[1] if len(sys.argv) > 1 else "stitch"
    size = parse_sizes([sys.argv[2]])[0] if len(sys.argv) > 2 else 1000
    lib = ctypes.CDLL(None)
    fn = implementation("fxcodegen")
    fn(workloads.build(shape, 16 if shape != "model" else 1).gm)
    wl = workloads.build(shape, size)
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    with tempfile.NamedTemporaryFile("r", suffix=".trace") as out:
        lib.fxc_trace_on()  # before the RSS is read: it makes its own records resident
        trim()
        anon_before = status_kb("RssAnon")
        code = fn(wl.gm)[0]
        lib.fxc_trace_off(out.name.encode())
        lines = out.read().splitlines()
    module = os.path.realpath(_core.__file__)
    base, syms = module_base(module), symbols(module)
    size_of = os.path.getsize(module)
    print(f"{shape} {wl.num_nodes} nodes: source {len(code):,} bytes")
    print(f"{'event':>5} {'bytes':>9} {'RSS KiB':>9}  allocated by")
    top = 0
    for line in lines:
        f = line.split()
        op, n, new, rss = f[0], int(f[1]), int(f[2]), int(f[5])
        if rss < 0:
            continue
        what = "free" if op == "f" else caller([int(a, 16) for a in f[6:]], base, size_of, syms)
        shown = f"{n}->{new}" if op == "r" else str(n)
        top = max(top, rss * page_kb - anon_before)
        print(f"{op:>5} {shown:>9} {rss * page_kb - anon_before:>9}  {what}")
    print(f"at most {top} KiB over the start = {top * 1024 / len(code):.2f} times the source")


if __name__ == "__main__":
    if "fxc_trace" not in os.environ.get("LD_PRELOAD", ""):
        env = dict(os.environ, LD_PRELOAD=str(build_shim()))
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env, check=False).returncode)
    main()
