"""Plot ns/node against graph size (log–log) from ``python -m fxcodegen bench --json`` output.

    python benches/plot.py benches/results.json [benches/results-1m.json ...] -o benches/results.png

One panel per shape (stitch, inline); one line per implementation. A flat line means a constant
cost per node; the floor is drawn dashed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

STYLE = {
    "fxcodegen": {"color": "tab:red", "marker": "o"},
    "reference": {"color": "tab:blue", "marker": "s"},
    "torch.fx": {"color": "tab:green", "marker": "^"},
    "floor": {"color": "black", "marker": "x", "linestyle": "--"},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="files written by `python -m fxcodegen bench --json`")
    p.add_argument("-o", "--output", required=True, help="output image (PNG)")
    args = p.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    data: dict = {}
    for path in args.json:
        with open(path) as f:
            data = json.load(f)
        for row in data["rows"]:
            if row["shape"] == "model":
                continue
            for impl, ns in row["ns_per_node"].items():
                series[row["shape"]][impl][row["nodes"]] = ns  # later files win
    if not series:
        print("no stitch/inline rows in", ", ".join(args.json), file=sys.stderr)
        return 1
    shapes = sorted(series, key=lambda s: ["stitch", "inline"].index(s) if s in STYLE else 9)
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for impl, points in series[shape].items():
            xs, ys = zip(*sorted(points.items()), strict=True)
            ax.plot(xs, ys, label=impl, **STYLE.get(impl, {}))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("graph size (nodes, inlined children included)")
        ax.set_ylabel("ns per node (median)")
        ax.set_title(f"{shape} graph")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    m = data.get("machine", {})
    fig.suptitle(
        f"fxcodegen codegen cost per node — {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"Python {m.get('python', '?')}, torch {m.get('torch', '?')}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
