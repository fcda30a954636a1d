"""A checkpoint's rows as the exporting worker reads them: only the buckets it owns.

A checkpoint written by W' workers holds, per table, one part per worker,
its rows grouped by bucket with ``bucket_offsets.npy``
(:func:`tnrec.table.files.save` with ``order="bucket"``). Worker ``r`` of W
exports the buckets ``b % W == r``: it opens only the parts that hold some of
them (part ``p`` of W' holds ``b % W' == p``) and copies only those buckets'
rows out of the memory-mapped files, so no process holds more than its shard.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

from tnrec import _fileio
from tnrec._fileio import StreamFile
from tnrec._hashing import NUM_BUCKETS, bucket_of
from tnrec.checkpoint.layout import check_listed_file
from tnrec.checkpoint.layout import read_manifest as read_ckpt
from tnrec.errors import ArgumentError, CheckpointError
from tnrec.export.layout import owned_buckets
from tnrec.layers.embedding import cvm_inputs
from tnrec.table import SparseTable
from tnrec.table import files as table_files
from tnrec.table.stream import npy_header

ROW_ARRAYS = ("keys", "weights", "show", "marker")
_DTYPES = {"keys": np.int64, "weights": np.float32, "show": np.float32, "marker": np.int32}


def checkpoint_rows(
    ckpt_dir: str, *, rank: int = 0, world_size: int = 1
) -> dict[str, dict[str, np.ndarray]]:
    """Read each table's rows of the buckets worker ``rank`` of ``world_size`` owns.

    Reads the parts' files directly (memory-mapped; only the parts and buckets
    needed): no tables, no process group. The checkpoint may have been written
    by any number of workers. With the defaults, every row.

    Args:
        ckpt_dir: a checkpoint generation directory (``<model_dir>/<dt>/<generation>``).
        rank: the worker r whose buckets (``bucket_of(key) % world_size == r``) to read.
        world_size: W.

    Returns:
        ``{table: {keys, weights, show, marker, generation}}``, rows sorted by key
        (``int64[n]``, ``float32[n, D]``, ``float32[n]``, ``int32[n]``; ``generation``
        is the checkpoint's, a 0-d int64 array).

    Raises:
        ArgumentError: ``rank`` is not in ``[0, world_size)``.
        CheckpointError: the manifest or a part is missing, damaged or inconsistent
            (ChecksumError, FormatVersionError as :func:`tnrec.checkpoint.read_manifest`).
    """
    ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (rank, world_size))
    if not ok or world_size < 1 or not 0 <= rank < world_size:
        raise ArgumentError(
            "checkpoint_rows: `rank` must be an int in [0, world_size) and `world_size` an int "
            f">= 1. Received: rank={rank!r}, world_size={world_size!r}."
        )
    manifest = read_ckpt(ckpt_dir)
    mine = owned_buckets(rank, world_size)
    out = {}
    for name, doc in manifest["tables"].items():
        dim = int(doc["dim"])
        pieces = []
        for part in doc["parts"]:
            held = owned_buckets(int(part["rank"]), len(doc["parts"]))
            if (mine & held).any():
                pieces.append(_part_rows(ckpt_dir, part, mine & held, dim))
        rows = {k: _concat([p[k] for p in pieces], k, dim) for k in ROW_ARRAYS}
        order = np.argsort(rows["keys"], kind="stable")
        out[name] = {k: v[order] for k, v in rows.items()}
        out[name]["generation"] = np.array(int(manifest["generation"]))
    return out


def _concat(arrays: list[np.ndarray], name: str, dim: int) -> np.ndarray:
    if arrays:
        return np.concatenate(arrays)
    return np.zeros((0, dim) if name == "weights" else 0, _DTYPES[name])


def _part_rows(
    ckpt_dir: str, part: dict[str, Any], buckets: npt.NDArray[np.bool_], dim: int
) -> dict[str, np.ndarray]:
    """The rows of ``buckets`` in one verified part."""
    rel = os.path.join(part["dir"], table_files.HEADER)
    pdir = os.path.dirname(check_listed_file(ckpt_dir, rel, part["header_sha256"]))
    header = table_files.verify(pdir)
    if int(header["dim"]) != dim:
        raise CheckpointError(f"{pdir}: dim {header['dim']} != manifest dim {dim}.")
    if header.get("storage", "npy") != "npy":
        raise CheckpointError(f"{pdir}: storage {header['storage']!r}; export reads 'npy' parts.")
    arrays = {k: _open(os.path.join(header["_dir"], f"{k}.npy")) for k in ROW_ARRAYS}
    n = int(header["count"])
    for k, a in arrays.items():
        want = (n, dim) if k == "weights" else (n,)
        if a.shape != want or a.dtype != _DTYPES[k]:
            raise CheckpointError(
                f"{pdir}/{k}.npy: expected {np.dtype(_DTYPES[k])}{list(want)} as table.json "
                f"says. Received: {a.dtype}{list(a.shape)}."
            )
    idx = _bucket_rows(header, arrays["keys"], buckets)
    return {k: np.asarray(a[idx]) for k, a in arrays.items()}


def _open(fname: str) -> np.ndarray:
    try:
        return _fileio.load_npy(fname, mmap=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"Cannot read {fname}: {e}.") from None


def _bucket_rows(
    header: dict[str, Any], keys: np.ndarray, buckets: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """Row indices (ascending) of the rows of ``buckets``: sliced by the offsets of a part
    saved by bucket, else found by hashing every key."""
    n = keys.shape[0]
    if header.get("order") != "bucket":
        return np.flatnonzero(buckets[bucket_of(np.ascontiguousarray(keys))])
    fname = os.path.join(header["_dir"], "bucket_offsets.npy")
    offsets = _open(fname)
    ok = (
        offsets.shape == (NUM_BUCKETS + 1,)
        and offsets.dtype == np.int64
        and offsets[0] == 0
        and offsets[-1] == n
        and bool((np.diff(offsets) >= 0).all())
    )
    if not ok:
        raise CheckpointError(f"{fname} does not match the {n} saved keys.")
    lengths = np.where(buckets, np.diff(offsets), 0)  # [1024]
    starts = np.repeat(offsets[:-1] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(int(lengths.sum()), dtype=np.int64)


# ---------------------------------------------------------------- a live table, streamed

_EXPORT_CHUNK = 1 << 20  # keys a chunk: 8 + 4 * D bytes each in flight


def write_table_shard(
    table: SparseTable, shard: str, min_show: float | None, cvm: bool = False
) -> tuple[int, str, str]:
    """Write a live table's ``keys.npy`` (ascending) and ``weights.npy`` into ``shard``,
    streamed: the sorted keys (8 bytes a key), a keep mask with ``min_show`` (1 byte a
    key) and one chunk of weights are all it holds beside the table.

    With ``cvm`` each row of ``weights.npy`` is ``D + 2`` wide: the weights, then
    the key's :func:`tnrec.layers.embedding.cvm_inputs` from its statistics now,
    the row a ``cvm=True`` layer pools.

    Returns:
        ``(rows written, sha256 of keys.npy, sha256 of weights.npy)``.

    Raises:
        WriteError: a file cannot be written (names it).
    """
    keys = table.keys()
    keep = None
    if min_show is not None:
        keep = np.empty(keys.shape[0], np.bool_)
        show_col = table.stats_offset
        for a in range(0, keys.shape[0], _EXPORT_CHUNK):
            b = min(keys.shape[0], a + _EXPORT_CHUNK)
            keep[a:b] = table.read_column(keys[a:b], show_col, 1)[:, 0] >= np.float32(min_show)
    n = int(keys.shape[0] if keep is None else keep.sum())
    kf = StreamFile(os.path.join(shard, "keys.npy"))
    wf = StreamFile(os.path.join(shard, "weights.npy"))
    try:
        kf.write(npy_header("i8", (n,)))
        wf.write(npy_header("f4", (n, table.dim + 2 * cvm)))
        for a in range(0, keys.shape[0], _EXPORT_CHUNK):
            k = keys[a : a + _EXPORT_CHUNK]
            if keep is not None:
                k = np.ascontiguousarray(k[keep[a : a + _EXPORT_CHUNK]])
            kf.write(k.data)
            w = table.read_column(k, 0, table.dim)  # [n, D]
            if cvm:
                st = table.read_column(k, table.stats_offset, 2)  # [n, 2] show, click
                w = np.ascontiguousarray(np.hstack([w, cvm_inputs(st[:, 0], st[:, 1])]))
            wf.write(w.data)
        return n, kf.close(), wf.close()
    except BaseException:
        kf.abort()
        wf.abort()
        raise
