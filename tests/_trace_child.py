"""A child process for the TORCH_TRACE test (not collected).

``python _trace_child.py CACHE_DIR RANGE_END...``: compiles the 1-layer toy decoder with
``fxcodegen.compile`` (Inductor) into ``CACHE_DIR`` once per ``RANGE_END`` (one range
``(1, RANGE_END)``), calls each on 8 tokens, checks it against eager and prints ``OK``
and how each model's first graph was obtained. The parent sets ``TORCH_TRACE``.
"""

from __future__ import annotations

import sys

import fxcodegen
import torch
from fxcodegen.toy import ATTENTION_OP, make_decoder


def main() -> None:
    cache_dir, ends = sys.argv[1], [int(a) for a in sys.argv[2:]]
    model = make_decoder(num_layers=1, hidden=32, heads=2)
    x = torch.randn(8, 32)
    for end in ends:
        compiled = fxcodegen.compile(
            model,
            splitting_ops=[ATTENTION_OP],
            compile_ranges=[(1, end)],
            cache_dir=cache_dir,
            progress=False,
        )
        torch.testing.assert_close(compiled(x), model(x))
        print("OBTAINED", end, compiled.graphs[0].obtained, compiled.graphs[0].cache)
    print("OK")


if __name__ == "__main__":
    main()
