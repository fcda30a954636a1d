"""Inference export: embedding dictionaries, the dense graph, the feature spec.

TensorNet's split: only the first layer is special. An export holds::

    path/
      manifest.json                  what the export is (fields below), sha256 of every file
      embeddings/<table>/keys.npy    int64[n], strictly increasing (np.load(mmap_mode="r"))
      embeddings/<table>/weights.npy float32[n, D]
      dense.pt2                      the model's forward_dense as a torch.export program
                                     (batch dimension dynamic), taking the pooled embeddings
                                     (flat, in manifest order) and the dense features;
                                     ``torch.export.load(path).module()`` runs it with torch
                                     alone
      dense.onnx                     the same network as ONNX (only with ``onnx=True``)

``manifest.json`` (``format`` ``"tnrec.export"``, ``format_version`` 2) is
written by :func:`tnrec._fileio.write_json`. Its fields:

* ``checksum``: ``"sha256:<hex>"`` of the canonical JSON of every other field.
  Any changed byte (a swapped input ``column``, a head's ``prediction``, a
  column ``default``) makes the export refuse to load instead of predicting
  differently;
* ``dt``: the day label given to :func:`export` (or null); ``min_show``: the
  pruning threshold (or null);
* ``feature_spec``: the feature-spec document the Predictor hashes raw rows with;
* ``inputs``: the dense graph's embedding inputs in argument order, each
  ``{layer, table, column, dim, combiner, sequence, max_length, output}``;
  ``num_dense``: the number of numeric columns (the graph's last argument, ``[B, F]``);
* ``heads``: ``[{name, prediction}]`` in the graph's output order (``prediction``
  is ``"identity"`` or ``"sigmoid"``, applied to the graph's output);
* ``tables``: ``{table: {dim, count}}``, the shape of each dictionary;
* ``files``: ``{relative path: sha256}`` of every other file;
* ``onnx``: ``{file, inputs, outputs}`` or null;
* ``provenance``: ``{model_dir, dt, generation, global_step, complete}``, the
  checkpoint the export was made from. For a model exported from memory,
  ``model_dir``, ``generation`` and ``complete`` are null, ``dt`` is the
  ``dt`` argument and ``global_step`` the model's.

:func:`read_manifest` checks every field the readers use, naming the file and
the field, and, with ``verify``, every file's sha256. Version-1 exports (no
``checksum``, no ``provenance``) still load: their fields are checked the same
way but a changed value cannot be detected.

A key not in a dictionary reads as zeros, exactly like a ``create=False``
pull; ``min_show`` prunes rows whose show count is below it (they then read
as zeros too). :class:`tnrec.serving.Predictor` runs an export from raw rows.

A delta export (:func:`export_delta`) holds the rows updated between two
checkpoints (by the tables' update markers) and the keys deleted
(``embeddings/<table>/deleted.npy``, int64, strictly increasing). Its manifest
(``format`` ``"tnrec.export.delta"``, version 2, checksummed) records ``since``
and ``to`` (the checkpoints' ``<dt>/<generation>`` labels),
``since_generation`` and ``to_generation``, ``min_show``, ``tables``
(``{table: {dim, updated, deleted}}``) and ``files``. :func:`apply_delta`
applied to the full export of the first gives the full export of the second.

Writes go to a hidden sibling directory that is renamed to ``path`` only when
every file is written, so a failed export (disk full) leaves nothing at ``path``.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec._fileio import (
    check_file,
    field,
    makedirs,
    publish,
    read_versioned_json,
    sha256_file,
    write_bytes,
    write_file,
    write_json,
)
from tnrec.errors import ArgumentError, CheckpointError, SpecError, WriteError
from tnrec.feature_column import (
    NumericColumn,
    SequenceCategoryColumn,
    from_spec,
)
from tnrec.feature_column.columns import COMBINERS
from tnrec.losses import PREDICTIONS, SINGLE

if TYPE_CHECKING:
    from tnrec.layers.spec import ExportModel as Model

FORMAT = "tnrec.export"
DELTA_FORMAT = "tnrec.export.delta"
FORMAT_VERSION = 2
LEGACY_VERSION = 1  # no checksum, no provenance; still read
MANIFEST = "manifest.json"
GRAPH = "dense.pt2"
ONNX_GRAPH = "dense.onnx"
PROVENANCE = ("model_dir", "dt", "generation", "global_step", "complete")
LAYER_OUTPUTS = ("list", "concat", "dict")  # tnrec.layers.embedding.OUTPUTS


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
        outs = out if isinstance(out, Mapping) else {SINGLE: out}
        if any(h not in outs for h in self.heads):
            got = sorted(outs) if isinstance(out, Mapping) else "one tensor"
            want = "one tensor" if self.heads == [SINGLE] else self.heads
            raise ArgumentError(
                f"{type(self.model).__name__}.forward_dense returned {got}, but the export "
                f"needs {want} (the heads of compile(); compile with one loss per head)."
            )
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
    except ArgumentError:
        raise
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
        WriteError: the file cannot be written.
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
    buf = io.BytesIO()  # serialised in memory: every write to disk goes through _fileio
    try:
        torch.onnx.export(
            graph,
            args,
            buf,  # type: ignore[arg-type]  # the TorchScript exporter writes to file objects
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
    write_bytes(path, buf.getvalue())
    return {"file": ONNX_GRAPH, "inputs": names, "outputs": outputs}


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
        _check_provenance(out, "export: `provenance`")
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
    if min_show is not None and not _is_number(min_show):
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
            _check_full(manifest, f"export {path}: {MANIFEST}")
        except CheckpointError as e:
            raise RuntimeError(f"internal error: the new manifest fails its checks: {e}") from e
        # not atomic by itself: the whole directory is published by one rename
        write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
    return path


# ---------------------------------------------------------------- the manifest's schema


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bad(where: str, name: str, expected: str, value: Any) -> CheckpointError:
    return CheckpointError(f"{where}: field {name!r} must be {expected}. Received: {value!r}.")


def _count(doc: dict[str, Any], name: str, where: str, minimum: int = 0) -> int:
    value = field(doc, name, int, where)
    if value < minimum:
        raise _bad(where, name, f"an int >= {minimum}", value)
    return int(value)


def _optional(doc: dict[str, Any], name: str, typ: type, where: str) -> Any:
    return field(doc, name, (typ, type(None)), where)


def _check_provenance(doc: Any, where: str) -> None:
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where} must be a JSON object. Received: {doc!r}.")
    unknown = sorted(set(doc) - set(PROVENANCE))
    if unknown:
        raise CheckpointError(f"{where}: unknown fields {unknown}; it has {list(PROVENANCE)}.")
    _optional(doc, "model_dir", str, where), _optional(doc, "dt", str, where)
    _optional(doc, "complete", bool, where)
    for name in ("generation", "global_step"):
        value = _optional(doc, name, int, where)
        if value is not None and value < 0:
            raise _bad(where, name, "an int >= 0 or null", value)


def _table_entries(tables: dict[str, Any], where: str) -> Iterator[tuple[str, dict, str]]:
    """Each ``(name, entry, where)`` of a manifest's ``tables``, the name a safe file name and
    the entry an object."""
    for name, t in tables.items():
        _safe_name(name, where, "table")
        w = f"{where}: tables[{name!r}]"
        if not isinstance(t, dict):
            raise CheckpointError(f"{w} must be a JSON object. Received: {t!r}.")
        yield name, t, w


def _safe_name(name: str, where: str, what: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"{where}: {what} {name!r} is not a relative path inside the export.")


def _check_files(doc: dict[str, Any], where: str, required: list[str]) -> None:
    files = field(doc, "files", dict, where)
    for rel, digest in files.items():
        _safe_name(rel, where, "file")
        if not (isinstance(digest, str) and len(digest) == 64):
            raise _bad(f"{where}: files", rel, "a sha256 (64 hex digits)", digest)
    missing = [r for r in required if r not in files]
    if missing:
        raise CheckpointError(f"{where}: field 'files' lacks {missing}.")


def _check_common(doc: dict[str, Any], where: str) -> None:
    min_show = field(doc, "min_show", (int, float, type(None)), where)
    if min_show is not None and not _is_number(min_show):
        raise _bad(where, "min_show", "a finite number or null", min_show)


def _check_full(doc: dict[str, Any], where: str) -> None:
    """Check every field of a full export's manifest that a reader uses, and their agreement."""
    _check_common(doc, where)
    _optional(doc, "dt", str, where)
    spec = field(doc, "feature_spec", dict, where)
    try:
        by_key = {c.key: c for c in from_spec(spec)}
    except SpecError as e:
        raise CheckpointError(f"{where}: field 'feature_spec' is invalid: {e}") from None
    num_dense = _count(doc, "num_dense", where)
    numeric = sum(isinstance(c, NumericColumn) for c in by_key.values())
    if num_dense != numeric:
        raise _bad(
            where, "num_dense", f"{numeric} (the numeric columns of feature_spec)", num_dense
        )
    tables = field(doc, "tables", dict, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "dim", w, 1), _count(t, "count", w)
    inputs = field(doc, "inputs", list, where)
    for i, spec_i in enumerate(inputs):
        _check_input(spec_i, f"{where}: inputs[{i}]", tables, by_key)
    heads = field(doc, "heads", list, where)
    if not heads:
        raise _bad(where, "heads", "a non-empty list", heads)
    for i, head in enumerate(heads):
        w = f"{where}: heads[{i}]"
        if not isinstance(head, dict):
            raise CheckpointError(f"{w} must be a JSON object. Received: {head!r}.")
        field(head, "name", str, w)
        if field(head, "prediction", str, w) not in PREDICTIONS:
            raise _bad(w, "prediction", f"one of {sorted(PREDICTIONS)}", head["prediction"])
    if len({h["name"] for h in heads}) != len(heads):
        raise _bad(where, "heads", "heads with distinct names", heads)
    onnx = _optional(doc, "onnx", dict, where)
    required = [GRAPH] + [
        f"embeddings/{t}/{f}" for t in tables for f in ("keys.npy", "weights.npy")
    ]
    if onnx is not None:
        required.append(field(onnx, "file", str, f"{where}: onnx"))
        (
            field(onnx, "inputs", list, f"{where}: onnx"),
            field(onnx, "outputs", list, f"{where}: onnx"),
        )
    _check_files(doc, where, required)
    if doc.get("format_version") != LEGACY_VERSION:
        _check_provenance(field(doc, "provenance", dict, where), f"{where}: provenance")


def _check_input(spec: Any, where: str, tables: dict[str, Any], by_key: dict[str, Any]) -> None:
    if not isinstance(spec, dict):
        raise CheckpointError(f"{where} must be a JSON object. Received: {spec!r}.")
    for name in ("layer", "table", "column", "combiner", "output"):
        field(spec, name, str, where)
    dim, max_length = _count(spec, "dim", where, 1), _count(spec, "max_length", where)
    seq = field(spec, "sequence", bool, where)
    if spec["table"] not in tables:
        raise _bad(where, "table", f"one of the tables {sorted(tables)}", spec["table"])
    if dim != tables[spec["table"]]["dim"]:
        raise _bad(where, "dim", f"{tables[spec['table']]['dim']} (its table's dim)", dim)
    if spec["combiner"] not in COMBINERS:
        raise _bad(where, "combiner", f"one of {list(COMBINERS)}", spec["combiner"])
    if spec["output"] not in LAYER_OUTPUTS:
        raise _bad(where, "output", f"one of {list(LAYER_OUTPUTS)}", spec["output"])
    col = by_key.get(spec["column"])
    if col is None or isinstance(col, NumericColumn):
        raise _bad(where, "column", "a categorical column of feature_spec", spec["column"])
    if seq != isinstance(col, SequenceCategoryColumn):
        raise _bad(where, "sequence", f"{not seq} (as feature_spec declares it)", seq)
    if seq and max_length != col.max_length:
        raise _bad(where, "max_length", f"{col.max_length} (feature_spec)", max_length)


def _check_delta(doc: dict[str, Any], where: str) -> None:
    """Check every field of a delta export's manifest that :func:`apply_delta` uses."""
    _check_common(doc, where)
    field(doc, "since", str, where), field(doc, "to", str, where)
    legacy = doc.get("format_version") == LEGACY_VERSION
    if not legacy:
        _count(doc, "since_generation", where), _count(doc, "to_generation", where)
    tables = field(doc, "tables", dict, where)
    for _, t, w in _table_entries(tables, where):
        _count(t, "updated", w), _count(t, "deleted", w)
        if not legacy:
            _count(t, "dim", w, 1)
    names = ("keys.npy", "weights.npy", "deleted.npy")
    _check_files(doc, where, [f"embeddings/{t}/{f}" for t in tables for f in names])


def read_manifest(path: str, fmt: str = FORMAT, verify: bool = True) -> dict[str, Any]:
    """Read and check an export's manifest (and, with ``verify``, every file's sha256).

    Args:
        path: the export directory.
        fmt: :data:`FORMAT` (a full export) or :data:`DELTA_FORMAT`.
        verify: check the sha256 of every file the manifest lists.

    Returns:
        The manifest without its checksum (``provenance`` is None for a version-1 export).

    Raises:
        CheckpointError: no export at ``path``, or a field is missing or invalid
            (names the file and the field).
        ChecksumError: the manifest or a file does not match its checksum.
        FormatVersionError: another format version.
    """
    path = os.path.abspath(os.fspath(path))
    fname = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        why = "it is not a directory" if os.path.exists(path) else "no such directory"
        raise CheckpointError(f"No export at {path}: {why}.")
    if not os.path.isfile(fname):
        raise CheckpointError(f"No export at {path}: {fname} does not exist.")
    what = "export manifest" if fmt == FORMAT else "delta export manifest"

    def legacy(d: dict[str, Any]) -> bool:
        # both must hold, so no single changed byte turns a version-2 manifest into one
        version = d.get("format_version")
        return type(version) is int and version == LEGACY_VERSION and "checksum" not in d

    manifest = read_versioned_json(fname, fmt, FORMAT_VERSION, what=what, legacy=legacy)
    if manifest.get("format") != fmt:
        raise CheckpointError(
            f"The {what} {fname} is not a {fmt} document (format {manifest.get('format')!r})."
        )
    (_check_full if fmt == FORMAT else _check_delta)(manifest, f"{what} {fname}")
    if fmt == FORMAT:
        manifest.setdefault("provenance", None)
    if verify:
        for rel, digest in manifest["files"].items():
            check_file(os.path.join(path, rel), digest, "Export", fname)
    return manifest


# ---------------------------------------------------------------- dictionaries


def _load_npy(fname: str, mmap: bool = True) -> np.ndarray:
    if not os.path.isfile(fname):
        raise CheckpointError(f"Export file {fname} is missing.")
    try:
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


def load_dictionary(
    path: str, table: str, manifest: dict[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, weights)`` of one table of an export, memory-mapped and checked.

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
    if manifest is None:
        manifest = read_manifest(path, verify=False)
    if table not in manifest["tables"]:
        raise ArgumentError(
            f"Export {path} has no table {table!r}; it has {sorted(manifest['tables'])}."
        )
    doc = manifest["tables"][table]
    d = os.path.join(path, "embeddings", table)
    kname, wname = os.path.join(d, "keys.npy"), os.path.join(d, "weights.npy")
    keys, weights = _load_npy(kname), _load_npy(wname)
    check_keys(keys, doc["count"], kname)
    check_weights(weights, keys.shape[0], doc["dim"], wname)
    return keys, weights


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
    if min_show is not None and not _is_number(min_show):
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
    upd_k, upd_w, deleted = (_load_npy(f, mmap=False) for f in names)
    check_keys(upd_k, doc["updated"], names[0])
    check_weights(upd_w, upd_k.shape[0], dim, names[1])
    check_keys(deleted, doc["deleted"], names[2])
    keep = ~np.isin(keys, deleted) & ~np.isin(keys, upd_k)
    all_k = np.concatenate([keys[keep], upd_k])
    all_w = np.concatenate([weights[keep], upd_w])
    order = np.argsort(all_k, kind="stable")
    return all_k[order], all_w[order]
