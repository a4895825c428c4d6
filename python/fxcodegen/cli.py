"""``python -m fxcodegen <command> ...``: each command parses its own arguments."""

from __future__ import annotations

import importlib
import sys

# command -> (module, function, one-line help). The function takes the remaining argv
# and returns an exit status.
COMMANDS = {
    "demo": ("fxcodegen.demo", "main", "compile a generated decoder piecewise and check it"),
    "bench": ("fxcodegen.bench.cli", "main", "codegen speed on large graphs vs baselines"),
    "cache": ("fxcodegen.cache_cli", "main", "inspect, verify or clear the artifact cache"),
}


def usage() -> str:
    lines = ["usage: python -m fxcodegen <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(f"unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[argv[0]]
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
