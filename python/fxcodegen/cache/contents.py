"""What a cache directory holds, read without unpickling or unmarshaling anything: its keys,
each artifact's metadata and sizes, the problems ``cache verify`` reports, and why a key
missed. Nothing here writes; :class:`~fxcodegen.cache.store.Cache` offers each as a method.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxcodegen.cache import files, trust
from fxcodegen.cache.artifact import canonical
from fxcodegen.cache.format import CacheError, decode_blob, read_meta
from fxcodegen.cache.keys import explain_difference
from fxcodegen.cache.layout import (
    ARTIFACT_SUFFIX,
    BLOBS_DIR,
    FACTORS_SUFFIX,
    KEY_RE,
    artifact_path,
    blob_path,
)

__all__ = [
    "StoredInfo",
    "explain_miss",
    "find",
    "info",
    "keys",
    "referenced_blobs",
    "stored_meta",
    "verify",
]


@dataclass
class StoredInfo:
    """What :func:`info` reports for one artifact file (read without unpickling)."""

    key: str
    path: Path
    size: int
    """Bytes of the artifact file plus the blobs it references."""
    pieces: int = 0
    entries: int = 0
    factors: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def keys(root: Path) -> list[str]:
    """The keys of the artifacts in the cache directory ``root``, sorted."""
    out = []
    for p in sorted(root.glob(f"*{ARTIFACT_SUFFIX}")):
        key = p.name[: -len(ARTIFACT_SUFFIX)]
        if KEY_RE.match(key):
            out.append(key)
    return out


def find(root: Path, prefix: str) -> str:
    """The one stored key starting with ``prefix`` (KeyError if none or several)."""
    matches = [k for k in keys(root) if k.startswith(prefix)]
    if len(matches) != 1:
        raise KeyError(f"{len(matches)} artifacts match {prefix!r}")
    return matches[0]


def stored_meta(root: Path, key: str) -> dict[str, Any]:
    """The artifact's checksum-verified metadata (``code``, ``factors``, ``pieces``, ...).
    Raises :class:`CacheError`."""
    path = artifact_path(root, key)
    try:
        raw, _ = trust.read_file(path, owner_only=False)
    except OSError as e:
        raise CacheError(path, f"unreadable ({e.strerror or e})") from None
    return read_meta(path, raw)[2]


def info(root: Path, key: str) -> StoredInfo:
    """Sizes, pieces, entries and factors of one artifact."""
    path = artifact_path(root, key)
    out = StoredInfo(key=key, path=path, size=0)
    try:
        raw, _ = trust.read_file(path, owner_only=False)
        out.size = len(raw)
        _, _, meta = read_meta(path, raw)
    except OSError as e:
        out.error = f"unreadable ({e.strerror or e})"
        return out
    except CacheError as e:
        out.error = e.reason
        return out
    out.factors = dict(meta.get("factors") or {})
    out.pieces = len(meta["pieces"])
    digests = set()
    for pm in meta["pieces"]:
        for ref in (pm.get("entries") or {}).values():
            out.entries += 1
            digests.add(ref.get("blob"))
    for d in digests:
        with contextlib.suppress(OSError, TypeError):
            out.size += os.lstat(blob_path(root, d)).st_size
    return out


def referenced_blobs(root: Path) -> set[str] | None:
    """The blobs every artifact references; None when some artifact cannot be read (then
    no blob can be said to be unreferenced)."""
    referenced: set[str] = set()
    for key in keys(root):
        path = artifact_path(root, key)
        try:
            raw, _ = trust.read_file(path)
            _, _, meta = read_meta(path, raw)
            for pm in meta["pieces"]:
                referenced.update(ref["blob"] for ref in pm["entries"].values())
        except (OSError, CacheError, KeyError, TypeError, AttributeError):
            return None
    return referenced


def verify(root: Path, untrusted: str | None) -> list[tuple[Path, str]]:
    """Every problem found, as ``(path, reason)``: ``untrusted`` (why the directory itself
    must not be used, or None), checksums of artifacts and blobs, permissions, files that
    are not regular, missing blobs, and the leftovers a sweep removes (stale temporary
    files, orphans older than :data:`files.ORPHAN_GRACE_S`)."""
    problems: list[tuple[Path, str]] = []
    if untrusted is not None:
        problems.append((root, untrusted))
    referenced: set[str] = set()
    for key in keys(root):
        path = artifact_path(root, key)
        try:
            raw, st = trust.read_file(path, owner_only=False)
            why = trust.owner_only_problem(st)
            if why:
                problems.append((path, why))
            _, _, meta = read_meta(path, raw)
            if meta["key"] != key:
                problems.append((path, f"holds key {meta['key'][:16]}…"))
            for pm in meta["pieces"]:
                for ref in pm["entries"].values():
                    referenced.add(ref["blob"])
        except trust.UnsafeFileError as e:
            problems.append((path, str(e.strerror)))
        except OSError as e:
            problems.append((path, f"unreadable ({e.strerror or e})"))
        except CacheError as e:
            problems.append((e.path, e.reason))
        except (KeyError, TypeError, AttributeError) as e:
            problems.append((path, f"malformed piece metadata: {e!r}"))
    blob_dir = root / BLOBS_DIR
    present = set(os.listdir(blob_dir)) if files.real_dir(blob_dir) else set()
    for digest in sorted(referenced | present):
        bpath = blob_dir / digest
        if digest.startswith(files.TMP_PREFIX):
            continue  # below
        if digest not in present:
            problems.append((bpath, "missing blob"))
            continue
        try:
            raw, st = trust.read_file(bpath, owner_only=False)
            why = trust.owner_only_problem(st)
            if why:
                problems.append((bpath, why))
            decode_blob(bpath, raw, digest)
        except trust.UnsafeFileError as e:
            problems.append((bpath, str(e.strerror)))
        except OSError as e:
            problems.append((bpath, f"unreadable ({e.strerror or e})"))
        except CacheError as e:
            problems.append((bpath, e.reason))
    for p in files.orphans(root, referenced):
        what = "unreferenced blob" if p.parent == blob_dir else "factors file without its artifact"
        problems.append((p, what))
    problems += [(p, "stale temporary file") for p in files.stale_temps(root)]
    return problems


def _all_factors(root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for p in sorted(root.glob(f"*{FACTORS_SUFFIX}")):
        try:
            raw, _ = trust.read_file(p)
            doc = json.loads(raw)
            yield str(doc["key"]), dict(doc["factors"])
        except (OSError, ValueError, KeyError, TypeError):
            continue


def explain_miss(root: Path, key: str, factors: Mapping[str, Any]) -> str:
    """A line saying why ``key`` missed: the factors that differ from the nearest stored
    artifact (the one with the fewest differing factors)."""
    mine = canonical(dict(factors))
    best: tuple[int, str, list[str]] | None = None
    for other, theirs in _all_factors(root):
        if other == key:
            continue
        diff = explain_difference(mine, theirs)
        if best is None or len(diff) < best[0]:
            best = (len(diff), other, diff)
    head = f"fxcodegen cache: miss for {key[:16]} in {root}"
    if best is None:
        return f"{head}: no other artifact to compare with"
    _, other, diff = best
    if not diff:
        return f"{head}: artifact {other[:16]} has the same factors (stored by another key scheme)"
    return f"{head}: nearest artifact {other[:16]} differs in " + "; ".join(diff)
