"""Inference export: embedding dictionaries in shards, the dense graph, the feature spec.

TensorNet's split: only the first layer is special. An export holds::

    path/
      manifest.json                  what the export is (fields below), sha256 of every file
      embeddings/<table>/shard-<r>-of-<W>/keys.npy
                                     int64[n_r], strictly increasing: the keys of shard r
                                     (np.load(mmap_mode="r")); r and W in five digits
      embeddings/<table>/shard-<r>-of-<W>/weights.npy
                                     float32[n_r, D], row i the vector of keys[i]; for a
                                     table of cvm=True layers float32[n_r, D + 2]: the
                                     vector, then the key's show and log(click + 1) -
                                     log(show + 1) at export time (the row those layers
                                     pool; its ``tables`` and ``inputs`` dim is D + 2)
      dense.pt2                      the model's forward_dense as a torch.export program
                                     (batch dimension dynamic), taking the pooled embeddings
                                     (flat, in manifest order) and the dense features;
                                     ``torch.export.load(path).module()`` runs it with torch
                                     alone
      dense.onnx                     the same network as ONNX (only with ``onnx=True``)

Every table is split into the same W shards, W the number of workers that
wrote the export (1 in one process: ``shard-00000-of-00001``). Shard ``r``
holds exactly the keys with ``bucket_of(key) % W == r``
(:func:`tnrec._hashing.bucket_of`, 1024 buckets): the buckets worker ``r``
owns in training, so under a :class:`~tnrec.distribute.PsStrategy` each
worker writes its own shards in parallel (``model.export`` and ``tnrec
export`` under ``torchrun``; from a checkpoint written by any number of
workers, each reads only the parts and buckets it owns), and rank 0 writes
the dense graph and the manifest after every shard is written and fsynced
(:mod:`~tnrec.export.workers`). No process holds more than its own shard.

``manifest.json`` (``format`` ``"tnrec.export"``, ``format_version`` 3) is
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
* ``routing``: ``{rule, num_buckets, num_shards}``: ``rule`` is
  ``"bucket_of(key) % num_shards"``, ``num_buckets`` 1024, ``num_shards`` W;
* ``tables``: ``{table: {dim, count, shards}}``, the shape of each dictionary
  and ``shards``, ``[{count}]`` per shard in shard order (summing to ``count``);
* ``files``: ``{relative path: sha256}`` of every other file, every shard's included;
* ``onnx``: ``{file, inputs, outputs}`` or null;
* ``provenance``: ``{model_dir, dt, generation, global_step, complete}``, the
  checkpoint the export was made from. For a model exported from memory,
  ``model_dir``, ``generation`` and ``complete`` are null, ``dt`` is the
  ``dt`` argument and ``global_step`` the model's.

:func:`read_manifest` checks every field the readers use, naming the file and
the field, and, with ``verify``, every file's sha256. Older exports still
load and read as one shard: version 2 (``embeddings/<table>/keys.npy`` and
``weights.npy``, no ``routing``) and version 1 (no ``checksum``, no
``provenance``: its fields are checked the same way but a changed value
cannot be detected). A shard's keys are checked to be strictly increasing
and all of that shard when it is loaded (:func:`load_shard`).

A key not in a dictionary reads as zeros, exactly like a ``create=False``
pull; ``min_show`` prunes rows whose show count is below it (they then read
as zeros too). :class:`tnrec.serving.Predictor` runs an export from raw rows,
routing each key to its shard; it can load only some shards (``shards=``).

A delta export (:func:`export_delta`) holds the rows updated between two
checkpoints (by the tables' update markers) and the keys deleted, in the same
shards: ``embeddings/<table>/shard-<r>-of-<W>/{keys,weights,deleted}.npy``
(``deleted.npy`` int64, strictly increasing). Worker r computes shard r from
its own buckets of both checkpoints. Its manifest (``format``
``"tnrec.export.delta"``, version 3, checksummed) records ``since`` and
``to`` (the checkpoints' ``<dt>/<generation>`` labels), ``since_generation``
and ``to_generation``, ``min_show``, ``routing``, ``tables`` (``{table: {dim,
updated, deleted, shards: [{updated, deleted}]}}``) and ``files``.
:func:`apply_delta` applied to the full export of the first (whole, or one
shard at a time) gives the full export of the second.

Writes go to a hidden sibling directory that rank 0 renames to ``path`` only
when every worker's files are written, so a failed export (disk full, on any
worker) leaves nothing at ``path``.

The package: :mod:`~tnrec.export.writer` (writing a full export),
:mod:`~tnrec.export.delta` (delta exports), :mod:`~tnrec.export.workers`
(the steps every worker takes), :mod:`~tnrec.export.rows` (a checkpoint's
rows of one worker's buckets), :mod:`~tnrec.export.graph` (the dense graph),
:mod:`~tnrec.export.layout` (where shards live, which shard a key is in),
:mod:`~tnrec.export.manifest` (the manifest's format and schema) and
:mod:`~tnrec.export.dictionary` (reading and checking the shards).
"""

from tnrec.export.delta import apply_delta, export_delta
from tnrec.export.dictionary import (
    check_keys,
    check_routing,
    check_weights,
    load_dictionary,
    load_shard,
)
from tnrec.export.graph import DenseGraph, example_args, export_dense, export_onnx, layer_inputs
from tnrec.export.layout import shard_of
from tnrec.export.manifest import (
    DELTA_FORMAT,
    FORMAT,
    FORMAT_VERSION,
    GRAPH,
    LEGACY_VERSION,
    MANIFEST,
    OLDER_VERSIONS,
    ONNX_GRAPH,
    PROVENANCE,
    read_manifest,
)
from tnrec.export.rows import checkpoint_rows
from tnrec.export.writer import export

__all__ = [
    "DELTA_FORMAT",
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPH",
    "LEGACY_VERSION",
    "MANIFEST",
    "OLDER_VERSIONS",
    "ONNX_GRAPH",
    "PROVENANCE",
    "DenseGraph",
    "apply_delta",
    "check_keys",
    "check_routing",
    "check_weights",
    "checkpoint_rows",
    "example_args",
    "export",
    "export_delta",
    "export_dense",
    "export_onnx",
    "layer_inputs",
    "load_dictionary",
    "load_shard",
    "read_manifest",
    "shard_of",
]
