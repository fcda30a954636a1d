"""Inference export: embedding dictionaries, the dense graph, the feature spec.

TensorNet's split: only the first layer is special. An export holds::

    path/
      manifest.json                  format version, feature spec, embedding layers,
                                     heads, tables (dim, count), sha256 of every file
      embeddings/<table>/keys.npy    int64[n], ascending (np.load(mmap_mode="r"))
      embeddings/<table>/weights.npy float32[n, D]
      dense.pt2                      the model's forward_dense as a torch.export program
                                     (batch dimension dynamic), taking the pooled embeddings
                                     (flat, in manifest order) and the dense features;
                                     ``torch.export.load(path).module()`` runs it with torch
                                     alone

A key not in a dictionary reads as zeros, exactly like a ``create=False``
pull; ``min_show`` prunes rows whose show count is below it (they then read
as zeros too). :class:`tnrec.serving.Predictor` runs an export from raw rows.

A delta export (:func:`export_delta`) holds the rows updated between two
checkpoints (by the tables' update markers) and the keys deleted;
:func:`apply_delta` applied to the full export of the first gives the full
export of the second.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec.errors import ArgumentError, CheckpointError, FormatVersionError
from tnrec.feature_column import SequenceCategoryColumn
from tnrec.table.files import check_file, sha256_file

if TYPE_CHECKING:
    from tnrec.model import Model

FORMAT = "tnrec.export"
DELTA_FORMAT = "tnrec.export.delta"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GRAPH = "dense.pt2"
ONNX_GRAPH = "dense.onnx"


def _save_npy(path: str, arr: np.ndarray) -> str:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return sha256_file(path)


# ---------------------------------------------------------------- the dense graph


def layer_inputs(model: Model) -> list[dict[str, Any]]:
    """Describe the pooled inputs of ``forward_dense``, in the graph's argument order."""
    out = []
    for layer in model.embedding_layers():
        for col in layer.columns:
            seq = isinstance(col.categorical, SequenceCategoryColumn)
            out.append(
                {
                    "layer": layer.name,
                    "table": layer.table_name,
                    "column": col.key,
                    "dim": col.dimension,
                    "combiner": col.combiner,
                    "sequence": seq,
                    "max_length": col.categorical.max_length if seq else 0,
                    "output": layer.output,
                }
            )
    return out


class DenseGraph(torch.nn.Module):
    """``forward_dense`` with flat tensor arguments, as traced for export.

    Arguments: for each input of :func:`layer_inputs`, ``[B, D]`` (pooled) or
    ``[B, T, D]`` and ``lengths[B]`` (sequence); then ``dense[B, F]``. Returns
    one ``[B]`` tensor per head, in ``heads`` order.
    """

    def __init__(self, model: Model, inputs: list[dict[str, Any]], heads: list[str]) -> None:
        super().__init__()
        self.model = model
        self.inputs = inputs
        self.heads = heads

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pooled: dict[str, Any] = {}
        at = 0
        by_layer: dict[str, list[tuple[str, Any]]] = {}
        for spec in self.inputs:
            if spec["sequence"]:
                value: Any = (args[at], args[at + 1])
                at += 2
            else:
                value = args[at]
                at += 1
            by_layer.setdefault(spec["layer"], []).append((spec["column"], value))
        for spec in self.inputs:
            name = spec["layer"]
            if name in pooled:
                continue
            cols = by_layer[name]
            if spec["output"] == "concat":
                pooled[name] = torch.cat([v for _, v in cols], dim=1)
            elif spec["output"] == "dict":
                pooled[name] = dict(cols)
            else:
                pooled[name] = [v for _, v in cols]
        out = self.model.forward_dense(pooled, args[at])
        outs = out if isinstance(out, dict) else {"": out}
        return tuple(_flat(outs[h]) for h in self.heads)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(-1) if t.dim() == 2 and t.shape[-1] == 1 else t


def example_args(
    inputs: list[dict[str, Any]], num_dense: int, batch: int = 3
) -> tuple[torch.Tensor, ...]:
    """Random example arguments of the dense graph (for tracing)."""
    g = torch.Generator().manual_seed(0)
    args: list[torch.Tensor] = []
    for spec in inputs:
        if spec["sequence"]:
            args.append(torch.randn(batch, spec["max_length"], spec["dim"], generator=g))
            args.append(torch.full((batch,), min(2, spec["max_length"]), dtype=torch.int64))
        else:
            args.append(torch.randn(batch, spec["dim"], generator=g))
    args.append(torch.randn(batch, num_dense, generator=g))
    return tuple(args)


def export_dense(
    model: Model, inputs: list[dict[str, Any]], num_dense: int, heads: list[str]
) -> torch.export.ExportedProgram:
    """Export the model's dense part with ``torch.export`` (any batch size)."""
    graph = DenseGraph(model, inputs, heads).eval()
    args = example_args(inputs, num_dense)
    batch = torch.export.Dim("batch", min=1)
    dynamic = tuple({0: batch} for _ in args)
    try:
        return torch.export.export(graph, args, dynamic_shapes=(dynamic,), strict=False)
    except Exception as e:  # torch.export raises many types; name the model and the cause
        raise ArgumentError(
            f"Cannot export {type(model).__name__}.forward_dense with torch.export: {e}"
        ) from e


def export_onnx(
    model: Model,
    inputs: list[dict[str, Any]],
    num_dense: int,
    heads: list[dict[str, str]],
    path: str,
) -> dict[str, Any]:
    """Write the dense part as ONNX (opset 17, dynamic batch); return its input/output names.

    Raises:
        ArgumentError: the ``onnx`` package is missing, or the network does not export.
    """
    try:
        import onnx  # noqa: F401  (torch.onnx needs it to write the file)
    except ImportError:
        raise ArgumentError(
            "export(onnx=True) needs the onnx package: pip install 'tnrec[onnx]'."
        ) from None
    graph = DenseGraph(model, inputs, [h["name"] for h in heads]).eval()
    args = example_args(inputs, num_dense)
    names = []
    for spec in inputs:
        names.append(f"{spec['layer']}.{spec['column']}")
        if spec["sequence"]:
            names.append(f"{spec['layer']}.{spec['column']}.lengths")
    names.append("dense")
    outputs = [h["name"] or "output" for h in heads]
    try:
        torch.onnx.export(
            graph,
            args,
            path,
            dynamo=False,
            opset_version=17,
            input_names=names,
            output_names=outputs,
            dynamic_axes={n: {0: "batch"} for n in [*names, *outputs]},
        )
    except Exception as e:  # the exporter raises many types; name the model and the cause
        raise ArgumentError(
            f"Cannot export {type(model).__name__}.forward_dense to ONNX: {e}"
        ) from e
    return {"file": ONNX_GRAPH, "inputs": names, "outputs": outputs}


# ---------------------------------------------------------------- full export


def _head_specs(model: Model) -> list[dict[str, str]]:
    heads = getattr(model, "_heads", []) or []
    if not heads:
        return [{"name": "", "prediction": "identity"}]
    return [{"name": h.name, "prediction": h.prediction} for h in heads]


def export(
    model: Model,
    path: str,
    *,
    min_show: float | None = None,
    tables: dict[str, dict[str, np.ndarray]] | None = None,
    dt: str | None = None,
    onnx: bool = False,
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

    Raises:
        ArgumentError: ``path`` exists, or the model runs on several workers
            (export from the checkpoint with ``tnrec export`` instead).
    """
    from tnrec.checkpoint import feature_spec

    path = os.path.abspath(path)
    if os.path.exists(path):
        raise ArgumentError(f"Export path {path} already exists; choose a new directory.")
    if tables is None:
        if model.ps.world_size != 1:
            raise ArgumentError(
                "model.export runs in one process; with several workers, save a checkpoint and "
                "run `tnrec export --model-dir ...`."
            )
        tables = {name: t.rows() for name, t in model.tables.items()}
    spec = feature_spec(model)
    num_dense = sum(1 for c in spec["columns"] if c.get("type") == "numeric")
    inputs = layer_inputs(model)
    heads = _head_specs(model)
    tmp = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}"
    )
    os.makedirs(tmp)
    try:
        files: dict[str, str] = {}
        table_docs = {}
        for name, rows in sorted(tables.items()):
            keys, weights = rows["keys"], rows["weights"]
            order = np.argsort(keys, kind="stable")
            keep = order if min_show is None else order[rows["show"][order] >= min_show]
            d = os.path.join("embeddings", name)
            os.makedirs(os.path.join(tmp, d))
            files[f"{d}/keys.npy"] = _save_npy(os.path.join(tmp, d, "keys.npy"), keys[keep])
            files[f"{d}/weights.npy"] = _save_npy(
                os.path.join(tmp, d, "weights.npy"), weights[keep]
            )
            table_docs[name] = {"dim": int(weights.shape[1]), "count": int(keep.shape[0])}
        was = model.training
        model.eval()
        try:
            program = export_dense(model, inputs, num_dense, [h["name"] for h in heads])
        finally:
            model.train(was)
        torch.export.save(program, os.path.join(tmp, GRAPH))
        files[GRAPH] = sha256_file(os.path.join(tmp, GRAPH))
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
            "files": files,
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_manifest(path: str, fmt: str = FORMAT, verify: bool = True) -> dict[str, Any]:
    """Read and check an export's manifest (and, with ``verify``, every file's sha256)."""
    fname = os.path.join(path, MANIFEST)
    try:
        with open(fname, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"No export at {path}: {fname} does not exist.") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"Cannot read {fname}: {e}.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise CheckpointError(f"{fname} is not a {fmt} manifest.")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatVersionError(
            f"{fname}: format_version {manifest.get('format_version')!r} is not supported "
            f"(this tnrec reads {FORMAT_VERSION})."
        )
    if verify:
        for rel, digest in manifest["files"].items():
            check_file(os.path.join(path, rel), digest, "Export", MANIFEST)
    return manifest


def load_dictionary(path: str, table: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, weights)`` of one table of an export, memory-mapped."""
    d = os.path.join(path, "embeddings", table)
    return (
        np.load(os.path.join(d, "keys.npy"), mmap_mode="r", allow_pickle=False),
        np.load(os.path.join(d, "weights.npy"), mmap_mode="r", allow_pickle=False),
    )


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


# ---------------------------------------------------------------- delta export


def export_delta(since_ckpt: str, to_ckpt: str, path: str, *, min_show: float | None = None) -> str:
    """Write the rows updated and the keys deleted between two checkpoints to ``path``.

    Updated = rows of ``to_ckpt`` whose update marker is newer than ``since_ckpt``'s
    generation (and, with ``min_show``, rows that crossed the threshold); deleted =
    keys exported at ``since_ckpt`` that ``to_ckpt`` no longer exports.
    """
    path = os.path.abspath(path)
    if os.path.exists(path):
        raise ArgumentError(f"Export path {path} already exists; choose a new directory.")
    old, new = checkpoint_rows(since_ckpt), checkpoint_rows(to_ckpt)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    files, docs = {}, {}
    try:
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
            d = os.path.join("embeddings", name)
            os.makedirs(os.path.join(tmp, d))
            files[f"{d}/keys.npy"] = _save_npy(os.path.join(tmp, d, "keys.npy"), rows["keys"][upd])
            files[f"{d}/weights.npy"] = _save_npy(
                os.path.join(tmp, d, "weights.npy"), rows["weights"][upd]
            )
            files[f"{d}/deleted.npy"] = _save_npy(os.path.join(tmp, d, "deleted.npy"), deleted)
            docs[name] = {"updated": int(upd.sum()), "deleted": int(deleted.shape[0])}
        manifest = {
            "format": DELTA_FORMAT,
            "format_version": FORMAT_VERSION,
            "since": _label(since_ckpt),
            "to": _label(to_ckpt),
            "min_show": min_show,
            "tables": docs,
            "files": files,
        }
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _label(ckpt_dir: str) -> str:
    """``<dt>/<generation>`` of a checkpoint directory."""
    gen_dir = os.path.abspath(ckpt_dir)
    return f"{os.path.basename(os.path.dirname(gen_dir))}/{os.path.basename(gen_dir)}"


def apply_delta(
    keys: np.ndarray, weights: np.ndarray, delta_path: str, table: str
) -> tuple[np.ndarray, np.ndarray]:
    """Return one table's dictionary ``(keys, weights)`` with a delta export applied."""
    read_manifest(delta_path, DELTA_FORMAT)
    d = os.path.join(delta_path, "embeddings", table)
    upd_k = np.load(os.path.join(d, "keys.npy"), allow_pickle=False)
    upd_w = np.load(os.path.join(d, "weights.npy"), allow_pickle=False)
    deleted = np.load(os.path.join(d, "deleted.npy"), allow_pickle=False)
    keep = ~np.isin(keys, deleted) & ~np.isin(keys, upd_k)
    all_k = np.concatenate([np.asarray(keys)[keep], upd_k])
    all_w = np.concatenate([np.asarray(weights)[keep], upd_w])
    order = np.argsort(all_k, kind="stable")
    return all_k[order], all_w[order]
