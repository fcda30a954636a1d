"""Writing the full inference export of a model: every worker writes its own dictionary shards.

Under a :class:`~tnrec.distribute.PsStrategy` of W workers each worker's
``model.tables`` hold the keys of its buckets (``bucket_of(key) % W == rank``),
which are exactly the keys of shard ``rank`` of W
(:mod:`tnrec.export.layout`): every worker writes that shard of every table,
and rank 0 the dense graph and the manifest (:mod:`tnrec.export.workers`).
In one process the same code writes shard 0 of 1.
"""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec._fileio import fsync_dir, sha256_file, write_bytes, write_json
from tnrec.errors import ArgumentError, CheckpointError
from tnrec.export.graph import export_dense, export_onnx, layer_inputs
from tnrec.export.layout import DICTIONARY_FILES, routing_doc, shard_dir, shard_of
from tnrec.export.manifest import (
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    ONNX_GRAPH,
    PROVENANCE,
    check_full_manifest,
    check_provenance,
    is_number,
)
from tnrec.export.rows import write_table_shard
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
from tnrec.losses import SINGLE

if TYPE_CHECKING:
    from tnrec.layers.spec import ExportModel as Model


def _head_specs(model: Model) -> list[dict[str, str]]:
    heads = model.heads
    if not heads:
        return [{"name": SINGLE, "prediction": "identity"}]
    return [{"name": h.name, "prediction": h.prediction} for h in heads]


def _check_name(name: str, where: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ArgumentError(f"{where}: a table name must be a file name. Received: {name!r}.")


def _check_rows(name: str, rows: Mapping[str, np.ndarray], min_show: float | None) -> None:
    """Check one table's rows given to :func:`export` (``tables=``)."""
    where = f"export: `tables[{name!r}]`"
    _check_name(name, where)
    need = ("keys", "weights", "show") if min_show is not None else ("keys", "weights")
    missing = [k for k in need if k not in rows]
    if missing:
        raise ArgumentError(f"{where} lacks {missing}. Received: {sorted(rows)}.")
    keys, weights = np.asarray(rows["keys"]), np.asarray(rows["weights"])
    if keys.dtype != np.int64 or keys.ndim != 1:
        raise ArgumentError(f"{where}: keys must be int64[n]. Received: {keys.dtype}{keys.shape}.")
    if weights.dtype != np.float32 or weights.shape[:1] != keys.shape or weights.ndim != 2:
        raise ArgumentError(
            f"{where}: weights must be float32[{keys.shape[0]}, D]. "
            f"Received: {weights.dtype}{weights.shape}."
        )
    if np.unique(keys).shape[0] != keys.shape[0]:
        raise ArgumentError(f"{where}: keys must be unique; some repeat.")


def _provenance(provenance: Mapping[str, Any] | None, model: Model, dt: str | None) -> dict:
    """The manifest's ``provenance``: the given fields (checked), the rest null."""
    if provenance is None:
        step = model.global_step
        return {**dict.fromkeys(PROVENANCE), "dt": dt, "global_step": step}
    if not isinstance(provenance, Mapping):
        raise ArgumentError(
            f"export: `provenance` must be a dict with keys {list(PROVENANCE)} or None. "
            f"Received: {provenance!r}."
        )
    unknown = sorted(set(provenance) - set(PROVENANCE))
    if unknown:
        raise ArgumentError(
            f"export: `provenance` has unknown keys {unknown}; it takes {list(PROVENANCE)}."
        )
    out = {k: provenance.get(k) for k in PROVENANCE}
    try:
        check_provenance(out, "export: `provenance`")
    except CheckpointError as e:
        raise ArgumentError(str(e)) from None
    return out


def export(
    model: Model,
    path: str,
    *,
    min_show: float | None = None,
    tables: dict[str, dict[str, np.ndarray]] | None = None,
    dt: str | None = None,
    onnx: bool = False,
    provenance: dict[str, Any] | None = None,
) -> str:
    """Write the inference export of ``model`` to ``path`` (atomically); return ``path``.

    On W workers (a model built under a :class:`~tnrec.distribute.PsStrategy`)
    every worker calls it: each writes the dictionary shards of its own buckets
    in parallel, rank 0 then the dense graph and the manifest, and the export
    appears at ``path`` whole or not at all (``path`` must be on a file system
    every worker sees). In one process it writes one shard.

    Args:
        model: the trained model (its tables: this worker's shard of each).
        path: a new directory.
        min_show: drop rows whose ``show`` is below this (they read as zeros).
        tables: the rows to export per table (``keys``, ``weights``, ``show``);
            by default the model's in-memory tables. On W workers, each worker's
            rows of its own buckets, and the same table names and dims on each.
        dt: the day label recorded in the manifest.
        onnx: also write the dense part as ONNX (``dense.onnx``, opset 17, dynamic
            batch; needs the ``onnx`` package: ``pip install tnrec[onnx]``). All zoo
            models (LR, WideDeep, DeepFM, DCN) export and match in onnxruntime.
        provenance: the checkpoint the model was loaded from, recorded in the
            manifest: ``model_dir`` (str), ``dt`` (str), ``generation`` (int),
            ``global_step`` (int), ``complete`` (bool, whether the day was
            trained to its end); a missing key or None records null. With
            ``provenance=None`` (a model exported from memory) only ``dt`` (this
            function's ``dt``) and ``global_step`` (the model's) are recorded.

    Raises:
        ArgumentError: ``path`` exists, an argument is invalid, ``tables`` hold
            keys of another worker's buckets, or the workers' tables differ.
        WriteError: a file cannot be written on some worker; nothing is left at ``path``.
        DistributedError: a worker crashed or stalled; nothing is left at ``path``.
    """
    workers = Workers(model.ps, export_path(path))
    plan: dict[str, Any] = {}

    def check() -> None:
        plan.update(_plan(model, workers, min_show, tables, dt, provenance))

    workers.agree(workers.attempt(check), "check the export's arguments")
    _check_same_tables(workers, plan["dims"])
    names = sorted(plan["dims"])

    def write_shards(tmp: str) -> np.ndarray:
        summary: list[float] = []
        for name in names:  # one table's rows at a time
            rel = shard_dir(name, workers.rank, workers.world_size, FORMAT_VERSION)
            full = make_shard_dir(tmp, rel)
            if tables is None:  # a live table: streamed, no copy of its rows
                n, dk, dw = write_table_shard(
                    model.tables[name], full, min_show, cvm=name in plan["cvm"]
                )
            else:
                keys, weights = _kept_rows(tables, name, min_show)
                dk = save_npy(os.path.join(full, "keys.npy"), keys)
                dw = save_npy(os.path.join(full, "weights.npy"), weights)
                n = keys.shape[0]
                del keys, weights
            fsync_dir(full)
            summary += shard_summary([n], [dk, dw])
        return np.array(summary, np.float64)

    def finish(tmp: str, summaries: np.ndarray) -> None:
        _write_manifest(model, tmp, plan, summaries, onnx)

    return write_sharded(workers, [f"embeddings/{n}" for n in names], write_shards, finish)


def _plan(
    model: Model,
    workers: Workers,
    min_show: float | None,
    tables: dict[str, dict[str, np.ndarray]] | None,
    dt: str | None,
    provenance: dict[str, Any] | None,
) -> dict[str, Any]:
    """Check the arguments and the rows given; on rank 0 also trace the dense graph.

    Returns:
        ``dims`` (``{table: D}``), ``provenance``, ``dt``, ``min_show``; on rank 0
        also what the manifest needs.
    """
    check_new_path(workers.path)
    if min_show is not None and not is_number(min_show):
        raise ArgumentError(f"export: `min_show` must be a number or None. Received: {min_show!r}.")
    if dt is not None and not isinstance(dt, str):
        raise ArgumentError(f"export: `dt` must be a str or None. Received: {dt!r}.")
    plan: dict[str, Any] = {"provenance": _provenance(provenance, model, dt), "dt": dt}
    plan["min_show"] = min_show
    if tables is None:  # the model's own rows, read table by table as they are written
        for name in model.tables:
            _check_name(name, f"export: table {name!r}")
        plan["dims"] = {name: int(t.dim) for name, t in model.tables.items()}
        plan["cvm"] = {layer.table_name for layer in model.embedding_layers() if layer.cvm}
        for name in plan["cvm"]:
            plan["dims"][name] += 2  # the weights, then the two CVM inputs
    else:
        _check_no_cvm(model, "export(tables=...)")
        plan["cvm"] = set()
        plan["dims"] = {}
        for name, given in tables.items():
            _check_rows(name, given, min_show)
            _check_owned(name, given, workers)
            plan["dims"][name] = int(np.asarray(given["weights"]).shape[1])
    if workers.rank == 0:
        plan.update(dense_plan(model))
    return plan


def _check_no_cvm(model: Model, what: str) -> None:
    """Raise if a layer of ``model`` has ``cvm=True`` (``what`` cannot carry its inputs).

    Raises:
        ArgumentError: names the layer and ``what``.
    """
    for layer in model.embedding_layers():
        if layer.cvm:
            raise ArgumentError(
                f'{what}: layer "{layer.name}" has cvm=True, and rows read from a checkpoint '
                "carry no CVM inputs the dictionary could hold. Export the live model "
                "(Model.export) instead."
            )


def _kept_rows(
    tables: dict[str, dict[str, np.ndarray]],
    name: str,
    min_show: float | None,
) -> tuple[np.ndarray, np.ndarray]:
    """One given table's keys and weights to export (``int64[n]`` sorted, ``float32[n, D]``)."""
    given = tables[name]
    keys, weights = np.asarray(given["keys"]), np.asarray(given["weights"])
    order = np.argsort(keys, kind="stable")
    keep = order if min_show is None else order[np.asarray(given["show"])[order] >= min_show]
    return keys[keep], weights[keep]


def dense_plan(model: Model) -> dict[str, Any]:
    """The feature spec, the graph's inputs and heads, and the serialised dense graph."""
    from tnrec.layers.spec import feature_spec

    spec = feature_spec(model)
    num_dense = sum(1 for c in spec["columns"] if c.get("type") == "numeric")
    inputs = layer_inputs(model)
    heads = _head_specs(model)
    was = model.training
    model.eval()
    try:
        program = export_dense(model, inputs, num_dense, [h["name"] for h in heads])
    finally:
        model.train(was)
    graph = io.BytesIO()  # serialised in memory: every write to disk goes through _fileio
    torch.export.save(program, graph)
    return {
        "feature_spec": spec,
        "num_dense": num_dense,
        "inputs": inputs,
        "heads": heads,
        "graph": graph.getvalue(),
    }


def _check_owned(name: str, rows: Mapping[str, np.ndarray], workers: Workers) -> None:
    """On W workers, every key given to a worker must be of its own buckets."""
    W = workers.world_size
    if W == 1:
        return
    keys = np.asarray(rows["keys"])
    owner = shard_of(keys, W)
    wrong = np.flatnonzero(owner != workers.rank)
    if wrong.shape[0]:
        k = int(keys[wrong[0]])
        raise ArgumentError(
            f"export: `tables[{name!r}]` on rank {workers.rank} holds key {k} of worker "
            f"{int(owner[wrong[0]])} of {W}; each worker exports the rows of its own buckets "
            "(bucket_of(key) % W == rank)."
        )


def _check_same_tables(workers: Workers, dims: Mapping[str, int]) -> None:
    """Every worker exports the same tables with the same dims (one small all-gather).

    Raises:
        ArgumentError: on every worker, when they differ.
    """
    sig = json.dumps(sorted(dims.items()))
    got = workers.gather(np.array([zlib.crc32(sig.encode()), len(dims)], np.float64))  # [W, 2]
    differ = np.flatnonzero((got != got[0]).any(axis=1))
    if differ.shape[0]:
        raise ArgumentError(
            f"export: the workers export different tables: rank {int(differ[0])}'s names or dims "
            "differ from rank 0's; every worker exports the same tables."
        )


def _write_manifest(
    model: Model, tmp: str, plan: dict[str, Any], summaries: np.ndarray, onnx: bool
) -> None:
    """Rank 0, after every shard is written: the dense graph, ONNX, the manifest."""
    names = sorted(plan["dims"])
    W = summaries.shape[0]
    files, shards = read_summaries(summaries, names, ("count",), DICTIONARY_FILES, FORMAT_VERSION)
    table_docs = {}
    for name in names:
        dim = plan["dims"][name]
        count = sum(s["count"] for s in shards[name])
        table_docs[name] = {"dim": dim, "count": count, "shards": shards[name]}
    write_bytes(os.path.join(tmp, GRAPH), plan["graph"])
    files[GRAPH] = sha256_file(os.path.join(tmp, GRAPH))
    onnx_doc = None
    if onnx:
        args = (plan["inputs"], plan["num_dense"], plan["heads"])
        onnx_doc = export_onnx(model, *args, os.path.join(tmp, ONNX_GRAPH))
        files[ONNX_GRAPH] = sha256_file(os.path.join(tmp, ONNX_GRAPH))
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dt": plan["dt"],
        "min_show": plan["min_show"],
        "feature_spec": plan["feature_spec"],
        "inputs": plan["inputs"],
        "num_dense": plan["num_dense"],
        "heads": plan["heads"],
        "routing": routing_doc(W),
        "tables": table_docs,
        "onnx": onnx_doc,
        "provenance": plan["provenance"],
        "files": files,
    }
    try:  # what readers will check; a failure here is a bug of this module
        check_full_manifest(manifest, f"export {tmp}: {MANIFEST}")
    except CheckpointError as e:
        raise RuntimeError(f"internal error: the new manifest fails its checks: {e}") from e
    # not atomic by itself: the whole directory is published by one rename
    write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
