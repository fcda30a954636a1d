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

The package: :mod:`~tnrec.export.writer` (writing full and delta exports),
:mod:`~tnrec.export.graph` (the dense graph) and :mod:`~tnrec.export.manifest`
(the manifest's format and schema, and the dictionaries it lists).
"""

from tnrec.export.graph import DenseGraph, example_args, export_dense, export_onnx, layer_inputs
from tnrec.export.manifest import (
    DELTA_FORMAT,
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    LEGACY_VERSION,
    MANIFEST,
    ONNX_GRAPH,
    PROVENANCE,
    check_keys,
    check_weights,
    load_dictionary,
    read_manifest,
)
from tnrec.export.writer import apply_delta, checkpoint_rows, export, export_delta

__all__ = [
    "DELTA_FORMAT",
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPH",
    "LEGACY_VERSION",
    "MANIFEST",
    "ONNX_GRAPH",
    "PROVENANCE",
    "DenseGraph",
    "apply_delta",
    "check_keys",
    "check_weights",
    "checkpoint_rows",
    "example_args",
    "export",
    "export_delta",
    "export_dense",
    "export_onnx",
    "layer_inputs",
    "load_dictionary",
    "read_manifest",
]
