"""Where a cache directory keeps what, and the format version of its files.

Layout of a cache directory (owner-only, see ``docs/cache.md``)::

    DIR/                      0700
      fxcodegen-cache.json    0600  the marker: this directory is an fxcodegen cache
      <key>.fxc               0600  the artifact: header + sections (meta, code, consts)
      <key>.factors.json      0600  the key's factors, human-readable
      blobs/<sha256>          0600  one compiled piece-entry, named by the hash of its bytes
      locks/<key>.lock        0600  the per-key lock (``filelock``)
      entries/<entry key>     0600  the blob holding one piece-entry (cooperative compile)
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "ARTIFACT_SUFFIX",
    "BLOBS_DIR",
    "ENTRIES_DIR",
    "FACTORS_SUFFIX",
    "FORMAT_VERSION",
    "KEY_RE",
    "LOCKS_DIR",
    "MARKER",
    "READABLE_VERSIONS",
    "artifact_path",
    "blob_path",
    "factors_path",
    "lock_path",
]

FORMAT_VERSION = 2
"""Version written by this fxcodegen. 1: no constant pool (``consts`` absent); 2: adds it."""
# Format 1 stays readable: load_artifact and `cache verify` see an older file as such, not damage.
READABLE_VERSIONS = (1, 2)
"""Versions this fxcodegen reads; any other is a clean miss."""

ARTIFACT_SUFFIX = ".fxc"
FACTORS_SUFFIX = ".factors.json"
BLOBS_DIR = "blobs"
LOCKS_DIR = "locks"
ENTRIES_DIR = "entries"
MARKER = "fxcodegen-cache.json"
"""The file that makes a directory an fxcodegen cache (``cache clear`` refuses others)."""

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
"""A cache key, an entry key or a blob's name: 64 lowercase hex digits."""


def artifact_path(root: Path, key: str) -> Path:
    return root / f"{key}{ARTIFACT_SUFFIX}"


def factors_path(root: Path, key: str) -> Path:
    return root / f"{key}{FACTORS_SUFFIX}"


def blob_path(root: Path, digest: str) -> Path:
    return root / BLOBS_DIR / digest


def lock_path(root: Path, key: str) -> Path:
    return root / LOCKS_DIR / f"{key}.lock"
