"""The checks on what the cache reads: files through one descriptor, directories by lstat.

Artifacts hold pickles, so the cache reads only what its user made: owner-only regular
files in owner-only directories. A file is opened without following a symbolic link and
without blocking (a FIFO in its place would block ``open`` until a writer comes), the
opened descriptor is checked with ``fstat``, and no more than the size seen there is read
(``/dev/zero`` in its place would otherwise be read until memory runs out).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = [
    "MAX_FILE_BYTES",
    "UnsafeFileError",
    "directory_problem",
    "kind_of",
    "owner_only_problem",
    "read_file",
]

MAX_FILE_BYTES = 4 << 30
"""The largest file the cache reads (4 GiB): a larger one is refused before reading, so a
sparse or hostile file cannot exhaust memory."""

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


class UnsafeFileError(OSError):
    """A file the cache will not read: a symbolic link, not a regular file, too large, or
    not owner-only. ``strerror`` says which (``"a FIFO, not a regular file"``)."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(errno.EPERM, reason, os.fspath(path))


def kind_of(st: os.stat_result) -> str:
    """``"a FIFO"``, ``"a directory"``, ...: what a file that is not regular is."""
    for test, name in _KINDS:
        if test(st.st_mode):
            return name
    return f"of type {stat.S_IFMT(st.st_mode):o}"


def owner_only_problem(st: os.stat_result) -> str | None:
    """Why a file or directory with this stat is not trusted, or None: it must belong to
    this user and be writable by nobody else."""
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def read_file(
    path: str | os.PathLike[str], *, owner_only: bool = True, max_bytes: int | None = None
) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` and the ``fstat`` of the descriptor read.

    Raises :class:`UnsafeFileError` (before reading anything) when ``path`` is a symbolic
    link, not a regular file, larger than ``max_bytes`` (default :data:`MAX_FILE_BYTES`),
    or (with ``owner_only``) not owner-only; ``FileNotFoundError`` when it is absent; any
    other ``OSError`` when it cannot be opened or read. A file that grows while it is read
    is read up to the size ``fstat`` gave; one that shrinks gives fewer bytes (which the
    format's lengths and checksums then reject).
    """
    limit = MAX_FILE_BYTES if max_bytes is None else max_bytes
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise UnsafeFileError(path, "a symbolic link (not followed)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(path, f"{kind_of(st)}, not a regular file")
        if owner_only:
            why = owner_only_problem(st)
            if why:
                raise UnsafeFileError(path, why)
        if st.st_size > limit:
            raise UnsafeFileError(path, f"too large ({st.st_size} bytes; the limit is {limit})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(st.st_size), st
    finally:
        os.close(fd)


def directory_problem(path: Path, *, create: bool = False, link_ok: bool = False) -> str | None:
    """Why the directory ``path`` must not be used, or None when it may.

    Checked with ``lstat``: a symbolic link is refused, except with ``link_ok`` one that
    belongs to this user (or root), whose target is then checked in its place; another
    user's link could be pointed elsewhere between the check and a read. The directory
    must belong to this user and be writable by nobody else. With ``create``, a missing
    directory is made owner-only (``0700``, whatever the umask). Raises ``OSError`` when
    it cannot be made or examined.
    """
    if create and not os.path.lexists(path):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if not link_ok:
            return f"{path} is a symbolic link"
        if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
            return f"{path} is a symbolic link owned by another user (uid {st.st_uid})"
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    why = owner_only_problem(st)
    return f"{path} is {why}" if why else None
