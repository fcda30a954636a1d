"""The dense part of a model as a ``torch.export`` program (and ONNX), flat tensor arguments."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tnrec._fileio import (
    write_bytes,
)
from tnrec.errors import ArgumentError
from tnrec.export.manifest import ONNX_GRAPH
from tnrec.feature_column import (
    SequenceCategoryColumn,
)
from tnrec.losses import SINGLE

if TYPE_CHECKING:
    from tnrec.layers.spec import ExportModel as Model

# ---------------------------------------------------------------- the dense graph


def layer_inputs(model: Model) -> list[dict[str, Any]]:
    """Describe the pooled inputs of ``forward_dense``, in the graph's argument order.

    A ``cvm=True`` layer's inputs have ``dim`` ``D + 2``: its table's dictionary
    holds each key's weights followed by its two CVM inputs.
    """
    out = []
    for layer in model.embedding_layers():
        for col in layer.columns:
            seq = isinstance(col.categorical, SequenceCategoryColumn)
            out.append(
                {
                    "layer": layer.name,
                    "table": layer.table_name,
                    "column": col.key,
                    "dim": layer.output_dim,
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
