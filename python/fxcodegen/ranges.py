"""Shape ranges: the entries a piece is compiled for.

A :class:`Range` is an inclusive interval of values of the dynamic size (e.g. the number of
tokens). :func:`ranges_from_endpoints` turns sorted endpoints into consecutive ranges.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALL_SIZES",
    "OutOfRangeError",
    "SizeTable",
    "Range",
    "normalize_ranges",
    "normalize_sizes",
    "ranges_from_endpoints",
]


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


@dataclass(frozen=True, order=True)
class Range:
    """An inclusive range ``start <= size <= end`` of the dynamic size.

    Hashable and ordered (by ``start``, then ``end``); ``size in r`` tests membership;
    ``str(r)`` is ``"(start, end)"``; ``start, end = r`` unpacks it.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        s = _as_int(self.start, "Range start")
        e = _as_int(self.end, "Range end")
        if s < 0:
            raise ValueError(f"Range start must be >= 0, got {s}")
        if s > e:
            raise ValueError(f"Range start must be <= end, got ({s}, {e})")
        object.__setattr__(self, "start", s)
        object.__setattr__(self, "end", e)

    def __iter__(self) -> Iterator[int]:
        return iter((self.start, self.end))

    def __contains__(self, size: object) -> bool:
        if isinstance(size, bool) or not isinstance(size, int):
            return False
        return self.start <= size <= self.end

    def is_single_size(self) -> bool:
        """True when the range holds exactly one size."""
        return self.start == self.end

    def __str__(self) -> str:
        return f"({self.start}, {self.end})"

    def __repr__(self) -> str:
        return f"Range({self.start}, {self.end})"


ALL_SIZES = Range(0, 2**63 - 1)
"""The default compile range: every size."""


class OutOfRangeError(ValueError):
    """A size of the range dimension falls in no compile range and is no compile size."""


class SizeTable:
    """A piece's compiled callables by size: single sizes first, then the range holding
    the size (by bisection). ``where`` names the size in errors, e.g. ``"input_ids, dim 1"``.
    """

    def __init__(self, name: str, where: str = "") -> None:
        self.name = name
        self.where = where
        self.exact: dict[int, Any] = {}
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.fns: list[Any] = []

    def add_size(self, size: int, fn: Any) -> None:
        self.exact[size] = fn

    def add_range(self, start: int, end: int, fn: Any) -> None:
        """Add a range above every range added so far (compile ranges are sorted)."""
        if self.ends and start <= self.ends[-1]:
            raise ValueError(f"{self.name}: range ({start}, {end}) is not above the others")
        self.starts.append(start)
        self.ends.append(end)
        self.fns.append(fn)

    def index(self, size: Any) -> int:
        """The position of the range holding ``size``; raises :class:`OutOfRangeError`."""
        i = bisect.bisect_right(self.starts, size) - 1
        if i < 0 or size > self.ends[i]:
            raise self.out_of_range(size)
        return i

    def lookup(self, size: Any) -> Any:
        fn = self.exact.get(size)
        return self.fns[self.index(size)] if fn is None else fn

    def out_of_range(self, size: Any) -> OutOfRangeError:
        ranges = ", ".join(str(Range(s, e)) for s, e in zip(self.starts, self.ends, strict=True))
        sizes = ", ".join(map(str, sorted(self.exact))) or "none"
        return OutOfRangeError(
            f"{self.name}: size {size!r}"
            + (f" ({self.where})" if self.where else "")
            + f" is in no compiled range and is no compiled size; ranges: {ranges or 'none'}; "
            f"sizes: {sizes}"
        )


def ranges_from_endpoints(endpoints: Iterable[int]) -> list[Range]:
    """Consecutive ranges ending at each endpoint.

    Endpoints are sorted and de-duplicated, so ``[8, 2, 8]`` and ``[2, 8]`` both give
    ``[Range(1, 2), Range(3, 8)]``. Endpoints must be ints >= 1.
    """
    values = sorted({_as_int(e, "endpoint") for e in endpoints})
    if not values:
        raise ValueError("ranges_from_endpoints needs at least one endpoint")
    if values[0] < 1:
        raise ValueError(f"endpoints must be >= 1, got {values[0]}")
    out: list[Range] = []
    start = 1
    for end in values:
        out.append(Range(start, end))
        start = end + 1
    return out


def _check_iterable(value: Any, name: str, of: str) -> None:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of {of}, got {type(value).__name__} {value!r}")


def normalize_ranges(compile_ranges: Iterable[Any]) -> list[Range]:
    """``compile_ranges`` (``Range``s or ``(start, end)`` pairs) sorted; overlaps are a
    ``ValueError``, anything else a ``TypeError``."""
    _check_iterable(compile_ranges, "compile_ranges", "Range or (start, end) pairs")
    out = []
    for r in compile_ranges:
        if isinstance(r, Range):
            out.append(r)
        elif isinstance(r, (tuple, list)) and len(r) == 2:
            out.append(Range(*r))
        else:
            raise TypeError(f"compile range must be a Range or a (start, end) pair, got {r!r}")
    out.sort()
    for a, b in zip(out, out[1:], strict=False):
        if b.start <= a.end:
            raise ValueError(f"compile ranges overlap: {a} and {b}")
    return out


def normalize_sizes(compile_sizes: Iterable[Any]) -> list[int]:
    """``compile_sizes`` (non-negative ints) sorted, without repeats."""
    _check_iterable(compile_sizes, "compile_sizes", "ints")
    sizes = set()
    for s in compile_sizes:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"compile size must be an int, got {type(s).__name__} {s!r}")
        if s < 0:
            raise ValueError(f"compile size must be >= 0, got {s}")
        sizes.add(s)
    return sorted(sizes)
