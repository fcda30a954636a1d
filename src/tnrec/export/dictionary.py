"""An export's dictionaries: reading and checking each table's shards (memory-mapped), and lookup.

A shard's keys are sorted and, being ``mix64`` outputs, spread evenly over
int64, so :func:`key_index` indexes them by their top bits; :func:`find_rows`
then finds a key by a binary search over the few keys of its prefix (about 8x
faster than ``np.searchsorted`` over the whole shard on Criteo-like batches) and
:func:`take_rows` copies the rows found::

    prefix(key) = (uint64(key) ^ 2**63) >> (64 - bits)    # monotonic in the int64 key
    starts[p]   = first position whose key has prefix >= p  # int64[2**bits + 1]
    key k sits, if anywhere, in keys[starts[prefix(k)] : starts[prefix(k) + 1]]
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numba as nb
import numpy as np
import numpy.typing as npt

from tnrec import _fileio
from tnrec._hashing import bucket_of
from tnrec.errors import ArgumentError, CheckpointError
from tnrec.export.layout import shard_dir
from tnrec.export.manifest import MANIFEST, read_manifest
from tnrec.table._llvm import _prefetch_r


def check_present(fname: str) -> None:
    """Raise naming the export file ``fname`` unless it exists.

    Raises:
        CheckpointError: it is missing or cannot be looked up.
    """
    try:
        there = _fileio.is_file(fname)
    except OSError as e:
        raise CheckpointError(f"Cannot read export file {fname}: {e}") from None
    if not there:
        raise CheckpointError(f"Export file {fname} is missing.")


def load_npy(fname: str, mmap: bool = True) -> np.ndarray:
    """Open one ``.npy`` file of an export (memory-mapped with ``mmap``).

    Raises:
        CheckpointError: the file is missing or damaged (names it).
    """
    check_present(fname)
    try:
        if _fileio.is_remote(fname):  # read whole: an object cannot be memory-mapped
            arr = np.load(io.BytesIO(_fileio.read_bytes(fname)), allow_pickle=False)
        else:
            arr = np.load(fname, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as e:  # numpy raises many types on a damaged header; name the file
        raise CheckpointError(
            f"Export file {fname} is damaged (not a readable .npy array: {e}); "
            "write the export anew."
        ) from None
    if not isinstance(arr, np.ndarray):  # np.load opens any zip archive as an .npz
        with contextlib.suppress(Exception):
            arr.close()
        raise CheckpointError(
            f"Export file {fname} is damaged (a zip archive, not an .npy array); "
            "write the export anew."
        )
    return arr


_CHUNK = 1 << 22  # compare keys in blocks: bounded memory on a memory-mapped file


def check_keys(keys: np.ndarray, count: int | None, fname: str) -> None:
    """Check that ``keys`` is int64[count], strictly increasing (sorted, no repeats).

    Raises:
        CheckpointError: names ``fname``, what was expected and what it holds.
    """
    if keys.dtype != np.dtype(np.int64) or keys.ndim != 1:
        raise CheckpointError(
            f"Export file {fname}: keys must be int64[n]. Received: {keys.dtype}{list(keys.shape)}."
        )
    if count is not None and keys.shape[0] != count:
        raise CheckpointError(
            f"Export file {fname} holds {keys.shape[0]} keys; {MANIFEST} says {count}."
        )
    for lo in range(0, max(keys.shape[0] - 1, 0), _CHUNK):
        block = np.asarray(keys[lo : lo + _CHUNK + 1])
        up = block[1:] > block[:-1]
        if not up.all():
            at = lo + int(np.argmin(up)) + 1
            raise CheckpointError(
                f"Export file {fname}: keys must be strictly increasing (sorted, unique); "
                f"position {at} holds {int(keys[at])} after {int(keys[at - 1])}."
            )


def check_weights(weights: np.ndarray, n: int, dim: int | None, fname: str) -> None:
    """Check that ``weights`` is float32[n, dim].

    Raises:
        CheckpointError: names ``fname``, what was expected and what it holds.
    """
    want_dim = "D" if dim is None else dim
    if (
        weights.dtype != np.dtype(np.float32)
        or weights.ndim != 2
        or weights.shape[0] != n
        or (dim is not None and weights.shape[1] != dim)
    ):
        raise CheckpointError(
            f"Export file {fname}: weights must be float32[{n}, {want_dim}] (the manifest and "
            f"keys.npy). Received: {weights.dtype}{list(weights.shape)}."
        )


def check_routing(keys: np.ndarray, shard: int, num_shards: int, fname: str) -> None:
    """Check that every key of shard ``shard`` belongs to it (``bucket_of(key) % W == shard``).

    Raises:
        CheckpointError: names ``fname``, the first key of another shard and its shard.
    """
    if num_shards == 1:
        return
    for lo in range(0, keys.shape[0], _CHUNK):
        block = np.ascontiguousarray(keys[lo : lo + _CHUNK])
        owner = bucket_of(block) % num_shards
        wrong = np.flatnonzero(owner != shard)
        if wrong.shape[0]:
            at = int(wrong[0])
            raise CheckpointError(
                f"Export file {fname}: key {int(block[at])} at position {lo + at} belongs to "
                f"shard {int(owner[at])} of {num_shards}, not to this shard {shard}."
            )


def table_doc(path: str, table: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's entry of ``table``.

    Raises:
        ArgumentError: the export has no table ``table`` (names the tables it has).
    """
    if table not in manifest["tables"]:
        raise ArgumentError(
            f"Export {path} has no table {table!r}; it has {sorted(manifest['tables'])}."
        )
    return manifest["tables"][table]


def check_shard_index(shard: Any, num_shards: int, where: str) -> int:
    """Return ``shard`` if it is a shard index of the export.

    Raises:
        ArgumentError: ``shard`` is not an int in ``[0, num_shards)``.
    """
    if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)):
        raise ArgumentError(f"{where}: a shard must be an int. Received: {shard!r}.")
    if not 0 <= int(shard) < num_shards:
        raise ArgumentError(
            f"{where}: shard {int(shard)} is not one of the export's {num_shards} shards "
            f"(0 to {num_shards - 1})."
        )
    return int(shard)


def load_shard(
    path: str, table: str, shard: int, manifest: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, weights)`` of one shard of one table, memory-mapped and checked.

    Args:
        path: the export directory.
        table: the table's name.
        shard: the shard's index r (0 for an unsharded version-1 or -2 export).
        manifest: the export's manifest, if already read (read without file hashes otherwise).

    Raises:
        ArgumentError: the export has no table ``table`` or no shard ``shard``.
        CheckpointError: a file is missing or damaged, or the keys are not int64,
            strictly increasing and all of this shard, or the weights not float32
            ``[n, dim]`` as the manifest records (names the file).
    """
    path = _fileio.absolute(path)
    if manifest is None:
        manifest = read_manifest(path, verify=False)
    doc = table_doc(path, table, manifest)
    num_shards = manifest["routing"]["num_shards"]
    shard = check_shard_index(shard, num_shards, f"Export {path}, table {table!r}")
    d = _fileio.join(path, shard_dir(table, shard, num_shards, manifest["format_version"]))
    kname, wname = _fileio.join(d, "keys.npy"), _fileio.join(d, "weights.npy")
    keys, weights = load_npy(kname), load_npy(wname)
    check_keys(keys, doc["shards"][shard]["count"], kname)
    check_routing(keys, shard, num_shards, kname)
    check_weights(weights, keys.shape[0], doc["dim"], wname)
    return keys, weights


def load_dictionary(
    path: str, table: str, manifest: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, weights)`` of one table of an export, checked; keys strictly increasing.

    An export of one shard is returned memory-mapped; the shards of a sharded
    export are merged in memory (use :func:`load_shard` to map one shard).

    Args:
        path: the export directory.
        table: the table's name.
        manifest: the export's manifest, if already read (read without file hashes otherwise).

    Raises:
        ArgumentError: the export has no table ``table``.
        CheckpointError: a file is missing or damaged, or the keys are not int64,
            strictly increasing, or the weights not float32 ``[n, dim]`` as the
            manifest records.
    """
    path = _fileio.absolute(path)
    if manifest is None:
        manifest = read_manifest(path, verify=False)
    table_doc(path, table, manifest)
    num_shards = manifest["routing"]["num_shards"]
    if num_shards == 1:
        return load_shard(path, table, 0, manifest)
    parts = [load_shard(path, table, r, manifest) for r in range(num_shards)]
    keys = np.concatenate([k for k, _ in parts])  # [n]
    weights = np.concatenate([w for _, w in parts])  # [n, D]
    order = np.argsort(keys, kind="stable")
    return keys[order], weights[order]


# ---------------------------------------------------------------- lookup

_MAX_INDEX_BITS = 20  # starts[] of at most 8 MiB a shard; beyond ~2M keys a prefix holds more
_SIGN = np.uint64(1 << 63)


@nb.njit(nogil=True, cache=True)
def _prefix_starts(keys: np.ndarray, shift: int, starts: np.ndarray) -> None:  # pragma: no cover
    n, j = keys.shape[0], 0
    for p in range(starts.shape[0] - 1):
        while j < n and (np.uint64(keys[j]) ^ _SIGN) >> np.uint64(shift) < np.uint64(p):
            j += 1
        starts[p] = j
    starts[starts.shape[0] - 1] = n


def key_index(keys: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], int]:
    """Index strictly increasing ``keys`` by their top bits for :func:`read_rows`.

    Returns:
        ``(starts, shift)``: ``starts[p]`` is the first position whose key has
        prefix ``>= p`` (``int64[2**bits + 1]``, about one key a prefix, at most
        ``2**20`` prefixes), ``shift = 64 - bits``.
    """
    bits = min(_MAX_INDEX_BITS, max(1, int(keys.shape[0]).bit_length() - 1))
    starts = np.empty((1 << bits) + 1, np.int64)  # [2**bits + 1]
    _prefix_starts(np.asarray(keys), 64 - bits, starts)
    return starts, 64 - bits


# A batch's keys, unsorted, read the dictionary anywhere: each read is a cache
# miss. The kernels start the reads of the key ``_AHEAD`` positions on while
# they work on this one (for a search, the prefix-index entry two steps ahead,
# then the keys it points to; for a copy, the row), so the misses of several
# keys overlap instead of following one another.
_AHEAD = 16


@nb.njit(nogil=True, cache=True)
def _find_rows(
    dict_keys: np.ndarray, starts: np.ndarray, shift: int, keys: np.ndarray, pos: np.ndarray
) -> None:  # pragma: no cover - compiled
    n = keys.shape[0]
    s_addr, k_addr = starts.ctypes.data, dict_keys.ctypes.data
    for i in range(n):
        if i + 2 * _AHEAD < n:
            _prefetch_r(
                s_addr + ((np.uint64(keys[i + 2 * _AHEAD]) ^ _SIGN) >> np.uint64(shift)) * 8
            )
        if i + _AHEAD < n:
            q = (np.uint64(keys[i + _AHEAD]) ^ _SIGN) >> np.uint64(shift)
            _prefetch_r(k_addr + starts[q] * 8)
        k = keys[i]
        p = (np.uint64(k) ^ _SIGN) >> np.uint64(shift)
        lo, hi = starts[p], starts[p + 1]
        while lo < hi:  # the first position in the prefix holding a key >= k
            m = (lo + hi) >> 1
            if dict_keys[m] < k:
                lo = m + 1
            else:
                hi = m
        pos[i] = lo if lo < starts[p + 1] and dict_keys[lo] == k else -1


@nb.njit(nogil=True, cache=True)
def _take_rows(
    weights: np.ndarray, pos: np.ndarray, dest: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    D = weights.shape[1]
    w_addr, row_bytes = weights.ctypes.data, D * 4
    n = pos.shape[0]
    for i in range(n):
        if i + _AHEAD < n and pos[i + _AHEAD] >= 0:
            a = w_addr + pos[i + _AHEAD] * row_bytes
            _prefetch_r(a)
            _prefetch_r(a + row_bytes - 1)
        o, at = dest[i], pos[i]
        if at >= 0:
            for d in range(D):
                out[o, d] = weights[at, d]
        else:
            for d in range(D):
                out[o, d] = 0.0


def find_rows(
    dict_keys: npt.NDArray[np.int64],
    index: tuple[npt.NDArray[np.int64], int],
    keys: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Return the position of every key of ``keys`` in ``dict_keys`` (-1: not there).

    Args:
        dict_keys: a shard's ``int64[n]`` keys, strictly increasing.
        index: ``key_index(dict_keys)``.
        keys: ``int64[N]`` keys to find (faster sorted: the reads go one way).
    """
    pos = np.empty(keys.shape[0], np.int64)  # [N]
    _find_rows(np.asarray(dict_keys), index[0], index[1], keys, pos)
    return pos


def take_rows(
    weights: npt.NDArray[np.float32],
    pos: npt.NDArray[np.int64],
    dest: npt.NDArray[np.int64],
    out: npt.NDArray[np.float32],
) -> None:
    """Write ``weights[pos[i]]`` (zeros where ``pos[i] < 0``) to ``out[dest[i]]``.

    Args:
        weights: a shard's ``float32[n, D]`` rows.
        pos: ``int64[N]`` positions from :func:`find_rows`.
        dest: ``int64[N]`` rows of ``out`` to write.
        out: ``float32[M, D]``, C-contiguous.
    """
    _take_rows(np.asarray(weights), pos, dest, out)


def read_rows(
    dict_keys: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float32],
    index: tuple[npt.NDArray[np.int64], int],
    keys: npt.NDArray[np.int64],
    dest: npt.NDArray[np.int64],
    out: npt.NDArray[np.float32],
) -> None:
    """Write the row of ``keys[i]`` to ``out[dest[i]]``: its weights, or zeros if not a key.

    :func:`find_rows` then :func:`take_rows`; see them for the arguments.
    """
    take_rows(weights, find_rows(dict_keys, index, keys), dest, out)
