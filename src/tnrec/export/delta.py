"""Delta exports between two checkpoints, written shard by shard, and applying them.

Worker ``r`` of W reads the buckets it owns from both checkpoints
(:func:`tnrec.export.rows.checkpoint_rows`) and writes shard ``r`` of every
table: the rows updated since the first checkpoint and the keys deleted. The
keys of those buckets are exactly the keys of shard ``r`` of any full export
written by W workers, so a delta's shard ``r`` applies to that shard alone.

Given the model of the second checkpoint (``model=``, as ``tnrec export
--delta`` does), a delta is complete: it also holds that checkpoint's dense
graph (``dense.pt2``) and, in its manifest's ``dense``, the fields of a full
export's manifest that describe it (``feature_spec``, ``num_dense``,
``inputs``, ``heads``), so the full export of the first checkpoint plus the
delta gives the full export of the second, for the whole model
(:meth:`tnrec.serving.Predictor.apply_delta`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from tnrec import _fileio
from tnrec._fileio import field, fsync_dir, sha256_file, write_bytes, write_json
from tnrec.errors import ArgumentError
from tnrec.export.dictionary import (
    check_keys,
    check_routing,
    check_weights,
    load_npy,
)
from tnrec.export.layout import DELTA_FILES, routing_doc, shard_dir, shard_of
from tnrec.export.manifest import (
    DELTA_FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    is_number,
    read_manifest,
)
from tnrec.export.rows import checkpoint_rows
from tnrec.export.workers import (
    Workers,
    check_new_path,
    export_path,
    make_shard_dir,
    read_summaries,
    save_npy,
    shard_summary,
    write_sharded,
)

if TYPE_CHECKING:
    from tnrec.export.writer import Model
    from tnrec.ps import ParameterServer


def _default_ps() -> ParameterServer:
    """The workers of the current strategy (every one calls), or this process alone."""
    from tnrec.distribute import current_strategy
    from tnrec.ps import LocalPS

    strategy = current_strategy()
    return strategy.make_ps({}) if strategy is not None else LocalPS({})


def export_delta(
    since_ckpt: str,
    to_ckpt: str,
    path: str,
    *,
    min_show: float | None = None,
    ps: ParameterServer | None = None,
    model: Model | None = None,
) -> str:
    """Write the rows updated and the keys deleted between two checkpoints to ``path``.

    Updated = rows of ``to_ckpt`` whose update marker is newer than ``since_ckpt``'s
    generation (and, with ``min_show``, rows that crossed the threshold); deleted =
    keys exported at ``since_ckpt`` that ``to_ckpt`` no longer exports. On W
    workers every worker calls it and writes the shard of its own buckets; the
    checkpoints may have been written by any number of workers.

    Args:
        since_ckpt: the first checkpoint's generation directory.
        to_ckpt: the second's.
        path: a new directory, on a file system every worker sees.
        min_show: the full exports' pruning threshold, or None.
        ps: the workers to share the work among; by default those of the
            current :class:`~tnrec.distribute.PsStrategy`, or this process alone.
        model: the model as of ``to_ckpt``, to make the delta complete (its dense
            graph and spec; rank 0 traces it), or None for the rows alone.

    Raises:
        ArgumentError: ``path`` exists, ``min_show`` is not a number, or ``model``
            has a ``cvm=True`` layer.
        CheckpointError: a checkpoint is missing or damaged.
        WriteError: a file cannot be written on some worker; nothing is left at ``path``.
    """
    workers = Workers(ps if ps is not None else _default_ps(), export_path(path))
    plan: dict[str, Any] = {}

    def check() -> None:
        check_new_path(workers.path)
        if min_show is not None and not is_number(min_show):
            raise ArgumentError(
                f"export_delta: `min_show` must be a number or None. Received: {min_show!r}."
            )
        cvm = [layer.name for layer in model.embedding_layers() if layer.cvm] if model else []
        if cvm:
            # show decay changes every row's CVM inputs without marking the row updated
            raise ArgumentError(
                f"export_delta: layers {cvm} have cvm=True; their dictionaries' CVM inputs "
                "change with every row's decayed statistics, which a delta of updated rows "
                "does not carry. Write a full export instead."
            )
        plan["rows"] = _delta_rows(since_ckpt, to_ckpt, min_show, workers)
        plan["doc"] = {
            "since": _label(since_ckpt),
            "to": _label(to_ckpt),
            "since_generation": _generation(since_ckpt),
            "to_generation": _generation(to_ckpt),
        }
        if model is not None and workers.rank == 0:
            from tnrec.export.writer import dense_plan

            plan["dense"] = dense_plan(model)

    workers.agree(workers.attempt(check), "read the checkpoints")
    rows = plan["rows"]
    names = sorted(rows)

    def write_shards(tmp: str) -> np.ndarray:
        summary: list[float] = []
        for name in names:
            rel = shard_dir(name, workers.rank, workers.world_size, FORMAT_VERSION)
            full = make_shard_dir(tmp, rel)
            got = rows[name]
            digests = [save_npy(os.path.join(full, f"{k}.npy"), got[k]) for k in _ARRAYS]
            fsync_dir(full)
            summary += shard_summary([got["keys"].shape[0], got["deleted"].shape[0]], digests)
        return np.array(summary, np.float64)

    def finish(tmp: str, summaries: np.ndarray) -> None:
        counts = ("updated", "deleted")
        files, shards = read_summaries(summaries, names, counts, DELTA_FILES, FORMAT_VERSION)
        docs = {
            name: {"dim": rows[name]["dim"]}
            | {c: sum(s[c] for s in shards[name]) for c in counts}
            | {"shards": shards[name]}
            for name in names
        }
        manifest = {
            "format": DELTA_FORMAT,
            "format_version": FORMAT_VERSION,
            **plan["doc"],
            "min_show": min_show,
            "routing": routing_doc(summaries.shape[0]),
            "tables": docs,
            "files": files,
        }
        dense = plan.get("dense")
        if dense is not None:
            write_bytes(os.path.join(tmp, GRAPH), dense["graph"])
            files[GRAPH] = sha256_file(os.path.join(tmp, GRAPH))
            keys = ("feature_spec", "num_dense", "inputs", "heads")
            manifest["dense"] = {k: dense[k] for k in keys}
        write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)

    return write_sharded(workers, [f"embeddings/{n}" for n in names], write_shards, finish)


_ARRAYS = ("keys", "weights", "deleted")  # in the order of layout.DELTA_FILES


def _delta_rows(
    since_ckpt: str, to_ckpt: str, min_show: float | None, workers: Workers
) -> dict[str, dict[str, Any]]:
    """This worker's updated rows and deleted keys of every table of ``to_ckpt``."""
    mine = {"rank": workers.rank, "world_size": workers.world_size}
    old, new = checkpoint_rows(since_ckpt, **mine), checkpoint_rows(to_ckpt, **mine)
    out = {}
    for name, rows in sorted(new.items()):
        since = int(old[name]["generation"]) if name in old else 0
        exported = (
            np.ones(rows["keys"].shape[0], bool) if min_show is None else rows["show"] >= min_show
        )
        before = old.get(name)
        if before is not None:
            was = before["keys"] if min_show is None else before["keys"][before["show"] >= min_show]
        else:
            was = np.zeros(0, np.int64)
        changed = rows["marker"] > since
        newly = ~np.isin(rows["keys"], was)  # e.g. crossed min_show without a push
        upd = exported & (changed | newly)
        out[name] = {
            "keys": rows["keys"][upd],
            "weights": rows["weights"][upd],
            "deleted": np.setdiff1d(was, rows["keys"][exported]),
            "dim": int(rows["weights"].shape[1]),
        }
    return out


def _label(ckpt_dir: str) -> str:
    """``<dt>/<generation>`` of a checkpoint directory."""
    gen_dir = _fileio.absolute(ckpt_dir).rstrip("/")
    return f"{os.path.basename(os.path.dirname(gen_dir))}/{os.path.basename(gen_dir)}"


def _generation(ckpt_dir: str) -> int:
    from tnrec.checkpoint import read_manifest as read_ckpt

    where = f"checkpoint manifest in {_fileio.absolute(ckpt_dir)}"
    return int(field(read_ckpt(ckpt_dir), "generation", int, where))


# ---------------------------------------------------------------- applying a delta


def _check_shard_arg(shard: Any) -> tuple[int, int]:
    ok = (
        isinstance(shard, tuple)
        and len(shard) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in shard)
        and shard[1] >= 1
        and 0 <= shard[0] < shard[1]
    )
    if not ok:
        raise ArgumentError(
            "apply_delta: `shard` must be None or (r, W), ints with 0 <= r < W. "
            f"Received: {shard!r}."
        )
    return int(shard[0]), int(shard[1])


def _read_delta_shard(
    path: str, table: str, d: int, manifest: dict[str, Any], dim: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(updated keys, their rows, deleted keys)`` of shard ``d`` of a delta, checked."""
    W = manifest["routing"]["num_shards"]
    counts = manifest["tables"][table]["shards"][d]
    rel = shard_dir(table, d, W, manifest["format_version"])
    names = [os.path.join(path, rel, f) for f in DELTA_FILES]
    upd_k, upd_w, deleted = (load_npy(f, mmap=False) for f in names)
    check_keys(upd_k, counts["updated"], names[0])
    check_routing(upd_k, d, W, names[0])
    check_weights(upd_w, upd_k.shape[0], dim, names[1])
    check_keys(deleted, counts["deleted"], names[2])
    check_routing(deleted, d, W, names[2])
    return upd_k, upd_w, deleted


def apply_delta(
    keys: np.ndarray,
    weights: np.ndarray,
    delta_path: str,
    table: str,
    *,
    shard: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Return one table's dictionary ``(keys, weights)`` with a delta export applied.

    Applied to the full export of the delta's first checkpoint it gives the full
    export of the second: the whole dictionary (``shard=None``; every shard of
    the delta is read), or one shard of it (``shard=(r, W)``: the keys with
    ``bucket_of(key) % W == r``, e.g. from :func:`tnrec.export.load_shard` of an
    export of W shards; only the part of the delta that routes there is used,
    and a delta of W shards is read from its shard r alone).

    Args:
        keys: the dictionary's keys (``int64[n]``), e.g. from :func:`load_dictionary`.
        weights: its rows (``float32[n, D]``).
        delta_path: the delta export.
        table: the table's name.
        shard: ``(r, W)`` when ``keys`` are shard r of W, or None.

    Raises:
        ArgumentError: ``keys``/``weights`` are not int64[n]/float32[n, D] with the
            delta's D, the delta has no table ``table``, ``shard`` is not ``(r, W)``
            or ``keys`` hold a key of another shard.
        CheckpointError: a file of the delta is missing, damaged, or not as its
            manifest records (keys strictly increasing and of their shard,
            weights float32[n, D]).
    """
    manifest = read_manifest(delta_path, DELTA_FORMAT)
    path = _fileio.absolute(delta_path)
    if table not in manifest["tables"]:
        raise ArgumentError(
            f"The delta {delta_path} has no table {table!r}; it has {sorted(manifest['tables'])}."
        )
    doc = manifest["tables"][table]
    keys, weights = np.asarray(keys), np.asarray(weights)
    dim = doc.get("dim", weights.shape[1] if weights.ndim == 2 else None)
    if (
        keys.dtype != np.int64
        or keys.ndim != 1
        or weights.dtype != np.float32
        or weights.shape != (keys.shape[0], dim)
    ):
        raise ArgumentError(
            f"apply_delta: `keys` and `weights` must be int64[n] and float32[n, {dim}] (table "
            f"{table!r} of the delta). Received: {keys.dtype}{list(keys.shape)} and "
            f"{weights.dtype}{list(weights.shape)}."
        )
    upd_k, upd_w, deleted = _delta_part(path, table, manifest, dim, keys, shard)
    keep = ~np.isin(keys, deleted) & ~np.isin(keys, upd_k)
    all_k = np.concatenate([keys[keep], upd_k])
    all_w = np.concatenate([weights[keep], upd_w])
    order = np.argsort(all_k, kind="stable")
    return all_k[order], all_w[order]


def _delta_part(
    path: str,
    table: str,
    manifest: dict[str, Any],
    dim: int | None,
    keys: np.ndarray,
    shard: tuple[int, int] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The delta's updated keys, rows and deleted keys for ``shard`` (None: all of them)."""
    W_delta = manifest["routing"]["num_shards"]
    reads = range(W_delta)
    target = None if shard is None else _check_shard_arg(shard)
    if target is not None:
        r, W = target
        owner = shard_of(keys, W)
        wrong = np.flatnonzero(owner != r)
        if wrong.shape[0]:
            raise ArgumentError(
                f"apply_delta: `keys` holds key {int(keys[wrong[0]])} of shard "
                f"{int(owner[wrong[0]])} of {W}, not of shard {r} (`shard`={shard!r})."
            )
        if W == W_delta:  # the delta's shard r holds exactly what routes here
            reads, target = range(r, r + 1), None
    parts = [_read_delta_shard(path, table, d, manifest, dim) for d in reads]
    upd_k, upd_w, deleted = (np.concatenate([p[i] for p in parts]) for i in range(3))
    if target is not None:  # a delta of other shards: keep what routes to shard r of W
        r, W = target
        mine = shard_of(upd_k, W) == r
        upd_k, upd_w = upd_k[mine], upd_w[mine]
        deleted = deleted[shard_of(deleted, W) == r]
    return upd_k, upd_w, deleted
