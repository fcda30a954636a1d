"""Checkpoints that survive a kill at any moment and load on any number of workers.

Layout::

    model_dir/
      _checkpoint                  {"dt", "dir": "<dt>/<generation>", "generation"}: moved last
      <dt>/<generation>/           a fresh directory per save; never modified once published
        manifest.json              format version, world size, feature spec, tables (dim,
                                   optimizer, initializer, seed, policy, parts), dense files,
                                   sha256 of every file it names, resume state
        dense.pt                   dense parameters + dense optimizer state (torch.save of
                                   tensors and numbers; read back with weights_only=True)
        workers/rank-<r>.json      worker r's input position and RNG state
        sparse/<table>/part-<r>-of-<W>/   worker r's shard: .npy files grouped by bucket
                                   with bucket offsets (streamed), its own table.json + sha256s

Saving: every worker writes into ``<dt>/.tmp-<generation>``, fsyncs, then a
barrier; rank 0 checks that every part is there, writes the manifest, renames
the directory to ``<dt>/<generation>`` and only then replaces ``_checkpoint``
(write a temporary file, fsync, rename). A kill at any point leaves the
previous checkpoint named by ``_checkpoint`` intact and loadable.

Loading (on W' workers): validate the manifest and the checksums of every
file this worker reads, and the model's tables and dense parameters against
it, before changing anything; then each worker reads, from each part, only
the rows of the buckets it owns (``bucket % W' == rank``).

Generation numbers grow over the whole ``model_dir``. A table's rows carry the
generation of the first checkpoint that will contain their change (the update
marker), so ``marker > g`` selects what changed since generation ``g``.

The package: :mod:`~tnrec.checkpoint.layout` (generations, the pointer, manifests,
the model-dir lock), :mod:`~tnrec.checkpoint.save` and :mod:`~tnrec.checkpoint.load`.
"""

from tnrec.checkpoint.layout import (
    DENSE,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    POINTER,
    POINTER_FORMAT,
    POINTER_VERSION,
    Pointer,
    generations,
    hold_lock,
    latest,
    lock_for_run,
    publish,
    read_manifest,
    read_pointer,
    verify,
)
from tnrec.checkpoint.load import LoadReport, load
from tnrec.checkpoint.save import save

__all__ = [
    "DENSE",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "POINTER",
    "POINTER_FORMAT",
    "POINTER_VERSION",
    "LoadReport",
    "Pointer",
    "generations",
    "hold_lock",
    "latest",
    "load",
    "lock_for_run",
    "publish",
    "read_manifest",
    "read_pointer",
    "save",
    "verify",
]
