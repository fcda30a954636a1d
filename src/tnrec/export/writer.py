"""Writing an export: the full export of a model, delta exports between checkpoints."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec._fileio import (
    field,
    makedirs,
    publish,
    sha256_file,
    write_bytes,
    write_file,
    write_json,
)
from tnrec.errors import ArgumentError, CheckpointError, WriteError
from tnrec.export.graph import export_dense, export_onnx, layer_inputs
from tnrec.export.manifest import (
    DELTA_FORMAT,
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    MANIFEST,
    ONNX_GRAPH,
    PROVENANCE,
    check_full_manifest,
    check_keys,
    check_provenance,
    check_weights,
    is_number,
    load_npy,
    read_manifest,
)
from tnrec.losses import SINGLE

if TYPE_CHECKING:
    from tnrec.layers.spec import ExportModel as Model

# ---------------------------------------------------------------- writing


def _save_npy(path: str, arr: np.ndarray) -> str:
    write_file(path, lambda f: np.save(f, np.ascontiguousarray(arr), allow_pickle=False))
    return sha256_file(path)


def _save_bytes(path: str, data: bytes) -> str:
    write_bytes(path, data)
    return sha256_file(path)


@contextlib.contextmanager
def _staged(path: str) -> Iterator[str]:
    """Yield a hidden sibling directory to write an export into; publish it as ``path``
    when the block succeeds, remove it when anything fails.

    Raises:
        WriteError: a file cannot be written (names it and ``path``).
    """
    name = f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}"
    tmp = os.path.join(os.path.dirname(path), name)
    try:
        makedirs(tmp)
        yield tmp
        publish(tmp, path)
    except WriteError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(f"Export {path} was not written (nothing is left there): {e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _new_path(path: str) -> str:
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path):
        raise ArgumentError(f"Export path {path} already exists; choose a new directory.")
    return path


# ---------------------------------------------------------------- full export


def _head_specs(model: Model) -> list[dict[str, str]]:
    heads = model.heads
    if not heads:
        return [{"name": SINGLE, "prediction": "identity"}]
    return [{"name": h.name, "prediction": h.prediction} for h in heads]


def _check_rows(name: str, rows: Mapping[str, np.ndarray], min_show: float | None) -> None:
    """Check one table's rows given to :func:`export` (``tables=``)."""
    where = f"export: `tables[{name!r}]`"
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise ArgumentError(f"{where}: a table name must be a file name. Received: {name!r}.")
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

    Args:
        model: the trained model (one process holds every row).
        path: a new directory.
        min_show: drop rows whose ``show`` is below this (they read as zeros).
        tables: the rows to export per table (``keys``, ``weights``, ``show``);
            by default the model's in-memory tables.
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
        ArgumentError: ``path`` exists, an argument is invalid, or the model runs
            on several workers (export from the checkpoint with ``tnrec export``).
        WriteError: a file cannot be written; nothing is left at ``path``.
    """
    from tnrec.layers.spec import feature_spec

    path = _new_path(path)
    if min_show is not None and not is_number(min_show):
        raise ArgumentError(f"export: `min_show` must be a number or None. Received: {min_show!r}.")
    if dt is not None and not isinstance(dt, str):
        raise ArgumentError(f"export: `dt` must be a str or None. Received: {dt!r}.")
    prov = _provenance(provenance, model, dt)
    if tables is None:
        if model.ps.world_size != 1:
            raise ArgumentError(
                "model.export runs in one process; with several workers, save a checkpoint and "
                "run `tnrec export --model-dir ...`."
            )
        tables = {name: t.rows() for name, t in model.tables.items()}
    for name, rows in tables.items():
        _check_rows(name, rows, min_show)
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
    with _staged(path) as tmp:
        files: dict[str, str] = {}
        table_docs = {}
        for name, rows in sorted(tables.items()):
            keys, weights = rows["keys"], rows["weights"]
            order = np.argsort(keys, kind="stable")
            keep = order if min_show is None else order[rows["show"][order] >= min_show]
            d = f"embeddings/{name}"
            makedirs(os.path.join(tmp, d))
            files[f"{d}/keys.npy"] = _save_npy(os.path.join(tmp, d, "keys.npy"), keys[keep])
            files[f"{d}/weights.npy"] = _save_npy(
                os.path.join(tmp, d, "weights.npy"), weights[keep]
            )
            table_docs[name] = {"dim": int(weights.shape[1]), "count": int(keep.shape[0])}
        files[GRAPH] = _save_bytes(os.path.join(tmp, GRAPH), graph.getvalue())
        onnx_doc = None
        if onnx:
            onnx_doc = export_onnx(model, inputs, num_dense, heads, os.path.join(tmp, ONNX_GRAPH))
            files[ONNX_GRAPH] = sha256_file(os.path.join(tmp, ONNX_GRAPH))
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dt": dt,
            "min_show": min_show,
            "feature_spec": spec,
            "inputs": inputs,
            "num_dense": num_dense,
            "heads": heads,
            "tables": table_docs,
            "onnx": onnx_doc,
            "provenance": prov,
            "files": files,
        }
        try:  # what readers will check; a failure here is a bug of this module
            check_full_manifest(manifest, f"export {path}: {MANIFEST}")
        except CheckpointError as e:
            raise RuntimeError(f"internal error: the new manifest fails its checks: {e}") from e
        # not atomic by itself: the whole directory is published by one rename
        write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
    return path


# ---------------------------------------------------------------- checkpoints -> rows


def checkpoint_rows(ckpt_dir: str) -> dict[str, dict[str, np.ndarray]]:
    """Read every table's rows (keys, weights, show, marker) from a checkpoint, any W.

    Reads the parts' files directly: no tables, no process group.
    """
    from tnrec.checkpoint import read_manifest as read_ckpt
    from tnrec.table import files as table_files

    manifest = read_ckpt(ckpt_dir)
    out = {}
    for name, doc in manifest["tables"].items():
        parts: dict[str, list[np.ndarray]] = {"keys": [], "weights": [], "show": [], "marker": []}
        for part in doc["parts"]:
            pdir = os.path.join(ckpt_dir, part["dir"])
            header = table_files.verify(pdir)
            for k in parts:
                parts[k].append(np.load(os.path.join(pdir, f"{k}.npy"), allow_pickle=False))
            if int(header["dim"]) != int(doc["dim"]):
                raise CheckpointError(f"{pdir}: dim {header['dim']} != manifest dim {doc['dim']}.")
        rows = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(rows["keys"], kind="stable")
        out[name] = {k: v[order] for k, v in rows.items()}
        out[name]["generation"] = np.array(int(manifest["generation"]))
    return out


def _generation(ckpt_dir: str) -> int:
    from tnrec.checkpoint import read_manifest as read_ckpt

    where = f"checkpoint manifest in {os.path.abspath(ckpt_dir)}"
    return int(field(read_ckpt(ckpt_dir), "generation", int, where))


# ---------------------------------------------------------------- delta export


def export_delta(since_ckpt: str, to_ckpt: str, path: str, *, min_show: float | None = None) -> str:
    """Write the rows updated and the keys deleted between two checkpoints to ``path``.

    Updated = rows of ``to_ckpt`` whose update marker is newer than ``since_ckpt``'s
    generation (and, with ``min_show``, rows that crossed the threshold); deleted =
    keys exported at ``since_ckpt`` that ``to_ckpt`` no longer exports.

    Raises:
        ArgumentError: ``path`` exists or ``min_show`` is not a number.
        WriteError: a file cannot be written; nothing is left at ``path``.
    """
    path = _new_path(path)
    if min_show is not None and not is_number(min_show):
        raise ArgumentError(
            f"export_delta: `min_show` must be a number or None. Received: {min_show!r}."
        )
    old, new = checkpoint_rows(since_ckpt), checkpoint_rows(to_ckpt)
    with _staged(path) as tmp:
        files, docs = {}, {}
        for name, rows in sorted(new.items()):
            since = int(old[name]["generation"]) if name in old else 0
            exported = (
                np.ones(rows["keys"].shape[0], bool)
                if min_show is None
                else rows["show"] >= min_show
            )
            before = old.get(name)
            if before is not None:
                was = (
                    before["keys"]
                    if min_show is None
                    else before["keys"][before["show"] >= min_show]
                )
            else:
                was = np.zeros(0, np.int64)
            changed = rows["marker"] > since
            newly = ~np.isin(rows["keys"], was)  # e.g. crossed min_show without a push
            upd = exported & (changed | newly)
            deleted = np.setdiff1d(was, rows["keys"][exported])
            d = f"embeddings/{name}"
            makedirs(os.path.join(tmp, d))
            files[f"{d}/keys.npy"] = _save_npy(os.path.join(tmp, d, "keys.npy"), rows["keys"][upd])
            files[f"{d}/weights.npy"] = _save_npy(
                os.path.join(tmp, d, "weights.npy"), rows["weights"][upd]
            )
            files[f"{d}/deleted.npy"] = _save_npy(os.path.join(tmp, d, "deleted.npy"), deleted)
            docs[name] = {
                "dim": int(rows["weights"].shape[1]),
                "updated": int(upd.sum()),
                "deleted": int(deleted.shape[0]),
            }
        manifest = {
            "format": DELTA_FORMAT,
            "format_version": FORMAT_VERSION,
            "since": _label(since_ckpt),
            "to": _label(to_ckpt),
            "since_generation": _generation(since_ckpt),
            "to_generation": _generation(to_ckpt),
            "min_show": min_show,
            "tables": docs,
            "files": files,
        }
        write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
    return path


def _label(ckpt_dir: str) -> str:
    """``<dt>/<generation>`` of a checkpoint directory."""
    gen_dir = os.path.abspath(ckpt_dir)
    return f"{os.path.basename(os.path.dirname(gen_dir))}/{os.path.basename(gen_dir)}"


def apply_delta(
    keys: np.ndarray, weights: np.ndarray, delta_path: str, table: str
) -> tuple[np.ndarray, np.ndarray]:
    """Return one table's dictionary ``(keys, weights)`` with a delta export applied.

    Args:
        keys: the dictionary's keys (``int64[n]``), e.g. from :func:`load_dictionary`.
        weights: its rows (``float32[n, D]``).
        delta_path: the delta export.
        table: the table's name.

    Raises:
        ArgumentError: ``keys``/``weights`` are not int64[n]/float32[n, D] with the
            delta's D, or the delta has no table ``table``.
        CheckpointError: a file of the delta is missing, damaged, or not as its
            manifest records (keys strictly increasing, weights float32[n, D]).
    """
    manifest = read_manifest(delta_path, DELTA_FORMAT)
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
    d = os.path.join(os.path.abspath(delta_path), "embeddings", table)
    names = [os.path.join(d, f) for f in ("keys.npy", "weights.npy", "deleted.npy")]
    upd_k, upd_w, deleted = (load_npy(f, mmap=False) for f in names)
    check_keys(upd_k, doc["updated"], names[0])
    check_weights(upd_w, upd_k.shape[0], dim, names[1])
    check_keys(deleted, doc["deleted"], names[2])
    keep = ~np.isin(keys, deleted) & ~np.isin(keys, upd_k)
    all_k = np.concatenate([keys[keep], upd_k])
    all_w = np.concatenate([weights[keep], upd_w])
    order = np.argsort(all_k, kind="stable")
    return all_k[order], all_w[order]
