"""Text dictionaries beside an export's ``.npy`` ones, for KV serving systems fed by TensorNet.

TensorNet's ``merge_sparse`` tool writes its online embedding dictionary as
lines ``sign\\tw_0\\t...\\tw_{d-1}``. :func:`write_tsv` writes the same lines
for every shard of every table of an export::

    tsv/<table>/shard-<r>-of-<W>.tsv      one file per table shard (W = 1: one per table)

* ``sign`` is the key's 64 bits printed as an unsigned decimal, as TensorNet
  prints its uint64 signs: key ``-1`` is ``18446744073709551615``. For a
  ``dtype="sign"`` column that is the input sign itself.
* ``w_i`` is the float32 weight in its shortest decimal form that reads back
  as the same float32 (Arrow's float32 formatting: ``0.1``, ``0.33333334``,
  ``1e-8``, ``-2.5e+30``), so parsing a cell as a double and rounding it to
  float32 gives the ``.npy`` value bit for bit.
* The lines follow the ``.npy`` shard's key order (ascending int64 keys); no
  header, ``\\n`` line ends, every row of the shard.

The files are not in the export's manifest (the Predictor never reads them);
each is written whole under its final name (a temporary file, then a rename),
so a file that exists is complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import IO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv

from tnrec import _fileio
from tnrec.errors import ArgumentError
from tnrec.export.dictionary import load_shard
from tnrec.export.layout import shard_name
from tnrec.export.manifest import read_manifest

TSV_DIR = "tsv"
_CHUNK_ROWS = 65536
_OPTIONS = pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")


def tsv_path(table: str, shard: int, num_shards: int) -> str:
    """The text dictionary of one shard of ``table``, relative to the export."""
    return f"{TSV_DIR}/{table}/{shard_name(shard, num_shards)}.tsv"


def write_tsv(path: str, shards: Sequence[int] | None = None) -> list[str]:
    """Write the text dictionary of each shard of each table of the export at ``path``.

    Args:
        path: a full export (``tnrec export`` / :func:`tnrec.export.export`).
        shards: the shards to write (each worker of a sharded export writes its
            own); None: all of them.

    Returns:
        The files written, relative to ``path``.

    Raises:
        ArgumentError: a shard index outside the export's shards.
        CheckpointError: no export at ``path`` or a damaged dictionary (names the file).
        WriteError: a file cannot be written.
    """
    path = _fileio.absolute(path)
    manifest = read_manifest(path, verify=False)
    W = int(manifest["routing"]["num_shards"])
    todo = range(W) if shards is None else list(shards)
    for r in todo:
        if not 0 <= r < W:
            raise ArgumentError(f"write_tsv: shard {r} is not in [0, {W}) of the export {path}.")
    written = []
    for table in sorted(manifest["tables"]):
        for r in todo:
            keys, weights = load_shard(path, table, r, manifest)  # [n], [n, D]
            rel = tsv_path(table, r, W)
            _fileio.makedirs(_fileio.join(path, f"{TSV_DIR}/{table}"))
            _write_whole(_fileio.join(path, rel), _writer(keys, weights))
            written.append(rel)
    return written


def _writer(
    keys: npt.NDArray[np.int64], weights: npt.NDArray[np.float32]
) -> Callable[[IO[bytes]], None]:
    """Write the ``sign\tw_0...`` lines of one shard, formatted by Arrow in chunks."""
    k = keys.view(np.uint64)  # [n]: the key's 64 bits, unsigned

    def write(f: IO[bytes]) -> None:
        for lo in range(0, k.shape[0], _CHUNK_ROWS):
            hi = min(lo + _CHUNK_ROWS, k.shape[0])
            cols = {"sign": pa.array(k[lo:hi])}
            cols.update({f"w_{i}": pa.array(weights[lo:hi, i]) for i in range(weights.shape[1])})
            pa_csv.write_csv(pa.table(cols), f, _OPTIONS)

    return write


def _write_whole(fname: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``fname`` whole: a temporary file beside it, then a rename (remotely: one
    upload, which replaces the object whole)."""
    if _fileio.is_remote(fname):
        _fileio.write_file(fname, write)
        return
    tmp = f"{fname}.tmp"
    _fileio.write_file(tmp, write)
    _fileio.publish(tmp, fname)
