from __future__ import annotations

import pytest
from fxcodegen import Range, ranges_from_endpoints


def test_range_is_inclusive_on_both_ends() -> None:
    r = Range(3, 8)
    assert 3 in r and 8 in r and 5 in r
    assert 2 not in r and 9 not in r
    assert (r.start, r.end) == (3, 8)
    start, end = r
    assert (start, end) == (3, 8)


def test_range_rejects_non_ints_in_membership() -> None:
    r = Range(0, 8)
    assert True not in r  # bool is not a size
    assert 3.0 not in r
    assert "3" not in r


def test_range_str_repr_and_single_size() -> None:
    assert str(Range(1, 8)) == "(1, 8)"
    assert repr(Range(1, 8)) == "Range(1, 8)"
    assert Range(4, 4).is_single_size()
    assert not Range(4, 5).is_single_size()


def test_range_hashable_and_ordered() -> None:
    d = {Range(1, 8): "a", Range(1, 8): "b", Range(9, 16): "c"}
    assert len(d) == 2 and d[Range(1, 8)] == "b"
    assert sorted([Range(9, 16), Range(1, 8), Range(1, 4)]) == [
        Range(1, 4),
        Range(1, 8),
        Range(9, 16),
    ]
    with pytest.raises(AttributeError):
        Range(1, 2).start = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("start", "end", "exc", "match"),
    [
        (5, 4, ValueError, "start must be <= end"),
        (-1, 4, ValueError, ">= 0"),
        (1.5, 4, TypeError, "must be an int"),
        (1, "8", TypeError, "must be an int"),
        (True, 4, TypeError, "bool"),
    ],
)
def test_range_validation(start: object, end: object, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        Range(start, end)  # type: ignore[arg-type]


def test_ranges_from_endpoints_sorts_and_dedups() -> None:
    assert ranges_from_endpoints([8, 2, 8]) == [Range(1, 2), Range(3, 8)]
    assert ranges_from_endpoints([1, 2, 4, 512]) == [
        Range(1, 1),
        Range(2, 2),
        Range(3, 4),
        Range(5, 512),
    ]
    assert ranges_from_endpoints([16]) == [Range(1, 16)]


def test_ranges_from_endpoints_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ranges_from_endpoints([])
    with pytest.raises(ValueError, match=">= 1"):
        ranges_from_endpoints([0, 4])
    with pytest.raises(TypeError, match="must be an int"):
        ranges_from_endpoints([2.5])
