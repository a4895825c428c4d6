"""The artifact cache: one integrity-checked file per compiled graph, piece blobs stored once.

- :mod:`~fxcodegen.cache.format`: what is stored and the file format (``docs/cache.md``);
- :mod:`~fxcodegen.cache.keys`: the key's factors, the key, how two keys' factors differ;
- :mod:`~fxcodegen.cache.trust`: the checks on every file and directory the cache reads;
- :mod:`~fxcodegen.cache.tidy`: atomic writes, and removing what dead or failed writers left;
- :mod:`~fxcodegen.cache.store`: the cache directory, its locks, ``get_or_create``;
- :mod:`~fxcodegen.cache.options`: the checks on the backend's cache options;
- :mod:`~fxcodegen.cache.work`, :mod:`~fxcodegen.cache.coop`: cooperative compile;
- :mod:`~fxcodegen.cache.remote`: the signed store on Redis.

The backend-facing methods of :class:`Cache` (``load``, ``store``, ``get_or_create``) never
raise because of the cache: they log a warning on the ``fxcodegen`` logger and treat the
problem as a miss. Only the explicit :func:`load_artifact` raises :class:`CacheError`.
"""

from fxcodegen.cache.format import (
    ARTIFACT_SUFFIX,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    Artifact,
    CacheError,
    PieceRecord,
    encode_artifact,
    load_artifact,
)
from fxcodegen.cache.keys import compute_key, explain_difference, make_factors
from fxcodegen.cache.store import (
    Cache,
    LockUnavailable,
    StoredInfo,
    open_cache,
    resolve_cache_dir,
)

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
