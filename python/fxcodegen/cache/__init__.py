"""The artifact cache: one integrity-checked file per compiled graph, piece blobs stored once.

- :mod:`~fxcodegen.cache.layout`: where a cache directory keeps what, the format version;
- :mod:`~fxcodegen.cache.artifact`: what is stored (:class:`Artifact`, :class:`PieceRecord`);
- :mod:`~fxcodegen.cache.format`: the artifact and blob files' bytes (``docs/cache.md``);
- :mod:`~fxcodegen.cache.keys`: the key's factors, the key, how two keys' factors differ;
- :mod:`~fxcodegen.cache.trust`: the checks on every file and directory the cache reads;
- :mod:`~fxcodegen.cache.files`: atomic writes, the cache marker, removing what dead or
  failed writers left, clearing;
- :mod:`~fxcodegen.cache.store`: the cache directory (:class:`Cache`), its locks, loading
  and storing;
- :mod:`~fxcodegen.cache.contents`: what a directory holds, read-only (``ls``, ``verify``,
  why a key missed);
- :mod:`~fxcodegen.cache.options`: the checks on the backend's cache options;
- :mod:`~fxcodegen.cache.work`, :mod:`~fxcodegen.cache.coop`: cooperative compile;
- :mod:`~fxcodegen.cache.remote`, :mod:`~fxcodegen.cache.signing`: the signed store on Redis.

The backend-facing methods of :class:`Cache` (``usable``, ``load``, ``store``) never raise
because of the cache: they log a warning on the ``fxcodegen`` logger and treat the problem
as a miss. Only the explicit :func:`load_artifact` raises :class:`CacheError`.
"""

from fxcodegen.cache.artifact import Artifact, PieceRecord
from fxcodegen.cache.contents import StoredInfo
from fxcodegen.cache.format import CacheError, encode_artifact, load_artifact
from fxcodegen.cache.keys import compute_key, explain_difference, make_factors
from fxcodegen.cache.layout import ARTIFACT_SUFFIX, FORMAT_VERSION, READABLE_VERSIONS
from fxcodegen.cache.store import Cache, LockUnavailable, open_cache, resolve_cache_dir

__all__ = [
    "ARTIFACT_SUFFIX",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "Artifact",
    "Cache",
    "CacheError",
    "LockUnavailable",
    "PieceRecord",
    "StoredInfo",
    "compute_key",
    "encode_artifact",
    "explain_difference",
    "load_artifact",
    "make_factors",
    "open_cache",
    "resolve_cache_dir",
]
