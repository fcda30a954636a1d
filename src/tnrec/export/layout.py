"""Where an export's dictionary shards live and which shard a key belongs to.

A format-version-3 export holds every table's dictionary in ``num_shards``
shards (W, the workers that wrote it; 1 for a single process)::

    embeddings/<table>/shard-<r>-of-<W>/keys.npy      r and W in five digits
    embeddings/<table>/shard-<r>-of-<W>/weights.npy
    embeddings/<table>/shard-<r>-of-<W>/deleted.npy   (delta exports only)

Shard ``r`` holds exactly the keys with ``bucket_of(key) % W == r`` -- the
buckets worker ``r`` of W owns while training (:mod:`tnrec.ps.sharded`), so
each worker writes its own shard. Versions 1 and 2 held one dictionary per
table directly in ``embeddings/<table>/``; readers treat it as shard 0 of 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tnrec._hashing import NUM_BUCKETS, bucket_of

SHARDED_VERSION = 3  # the first format version with shards
ROUTING_RULE = "bucket_of(key) % num_shards"
DICTIONARY_FILES = ("keys.npy", "weights.npy")
DELTA_FILES = ("keys.npy", "weights.npy", "deleted.npy")


def shard_name(shard: int, num_shards: int) -> str:
    """``shard-<r>-of-<W>``, both in five digits (so a listing sorts by shard)."""
    return f"shard-{shard:05d}-of-{num_shards:05d}"


def shard_dir(name: str, shard: int, num_shards: int, version: int) -> str:
    """The directory of one shard of table ``name``, relative to the export.

    Args:
        name: the table's name.
        shard: the shard's index r, in ``[0, num_shards)``.
        num_shards: W.
        version: the export's ``format_version`` (1 and 2 have one unsharded dictionary).
    """
    if version < SHARDED_VERSION:
        return f"embeddings/{name}"
    return f"embeddings/{name}/{shard_name(shard, num_shards)}"


def shard_files(
    name: str, num_shards: int, version: int, files: tuple[str, ...] = DICTIONARY_FILES
) -> list[str]:
    """Every file of every shard of table ``name`` (relative paths), shard by shard."""
    return [
        f"{shard_dir(name, r, num_shards, version)}/{f}" for r in range(num_shards) for f in files
    ]


def routing_doc(num_shards: int) -> dict[str, object]:
    """The manifest's ``routing`` field: how a reader finds a key's shard."""
    return {"rule": ROUTING_RULE, "num_buckets": NUM_BUCKETS, "num_shards": num_shards}


def shard_of(keys: npt.NDArray[np.int64], num_shards: int) -> npt.NDArray[np.int64]:
    """Return the shard of each key: ``bucket_of(key) % num_shards``.

    Args:
        keys: ``int64[n]``.
        num_shards: W >= 1.

    Raises:
        ArgumentError: ``keys`` is not a 1-D int64 array.
    """
    if num_shards == 1:
        return np.zeros(np.asarray(keys).shape[0], np.int64)
    return bucket_of(keys) % num_shards


def owned_buckets(shard: int, num_shards: int) -> npt.NDArray[np.bool_]:
    """``bool[1024]``: the buckets of shard ``shard`` of ``num_shards``."""
    return np.arange(NUM_BUCKETS) % num_shards == shard
