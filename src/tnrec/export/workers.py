"""Writing one export from every worker at once: each its own shards, then rank 0 publishes.

The steps, every worker calling in the same order (in one process each
collective is the identity)::

    check     every worker checks its arguments and its rows   -- agree
    create    rank 0 creates the hidden sibling <dir>/.<name>.tmp-<token>
              and the tables' directories in it                 -- agree
    shards    every worker writes and fsyncs its shard files    -- agree
    gather    every worker's counts and sha256s reach rank 0 (all_gather)
    publish   rank 0 writes the dense graph and the manifest,
              fsyncs, renames the directory to <dir>/<name>     -- agree

``agree`` is one all-reduce of a failure code per worker: when any worker
fails a step, every worker raises (the failed one its own error, the others
an error of the same class naming the failed rank), and rank 0 removes the
temporary directory, after every worker has left the step, so a failed
write on any worker leaves nothing at the final path. The export path must
be on a file system every worker sees, as for checkpoints.

On an object store (``s3://`` ...), which has no rename, every worker writes
under the final prefix and rank 0's ``manifest.json``, written last, is what
makes it an export: a reader (the Predictor) refuses a prefix without one. A
failed export deletes the prefix; one that was killed leaves objects without
a manifest, which the next export to the same path deletes before writing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tnrec import _fileio
from tnrec._fileio import (
    fsync_dir,
    makedirs,
    publish_dir,
    remove_tree,
    sha256_file,
    staging_dir,
    write_file,
)
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    ChecksumError,
    DataError,
    DistributedError,
    MismatchError,
    TnrecError,
    WriteError,
)
from tnrec.export.layout import shard_dir

if TYPE_CHECKING:
    from tnrec.ps import ParameterServer

# the classes a failure code names; anything else reads as a DistributedError on the others
_KINDS: tuple[type[TnrecError], ...] = (
    WriteError,
    ArgumentError,
    MismatchError,
    ChecksumError,
    CheckpointError,
    DataError,
    DistributedError,
)
DIGEST_VALUES = 16  # a sha256 as 16 uint16, each exact in the float64 of the collectives


def digest_values(hex_digest: str) -> np.ndarray:
    """A sha256 (64 hex digits) as ``float64[16]``, to travel in an all-gather."""
    return np.frombuffer(bytes.fromhex(hex_digest), dtype=">u2").astype(np.float64)


def values_digest(values: np.ndarray) -> str:
    """The inverse of :func:`digest_values`."""
    return np.asarray(values).astype(">u2").tobytes().hex()


def _kind(error: BaseException) -> int:
    for i, cls in enumerate(_KINDS):
        if isinstance(error, cls):
            return i + 1
    return _KINDS.index(DistributedError) + 1


class Workers:
    """The workers writing one export to ``path``: rank, W and their agreement on each step.

    Args:
        ps: the collectives (``model.ps``, or a table-less one from the strategy).
        path: the export's final directory (absolute).
    """

    def __init__(self, ps: ParameterServer, path: str) -> None:
        self.ps = ps
        self.rank = int(ps.rank)
        self.world_size = int(ps.world_size)
        self.path = path

    def not_written(self, why: object) -> str:
        return f"Export {self.path} was not written (nothing is left there): {why}"

    def agree(self, error: Exception | None, step: str) -> None:
        """Raise on every worker if any worker failed ``step`` (``error`` is this worker's).

        Raises:
            TnrecError: this worker's ``error``; on the others, an error of its class
                naming the rank that failed.
        """
        codes = np.zeros(self.world_size, np.float64)  # [W]
        codes[self.rank] = 0 if error is None else _kind(error)
        codes = self.ps.all_reduce_sum(codes)
        if error is not None:
            raise error
        failed = np.flatnonzero(codes)
        if failed.shape[0]:
            r = int(failed[0])
            cls = _KINDS[int(codes[r]) - 1]
            raise cls(
                self.not_written(
                    f"rank {r} of {self.world_size} failed to {step} ({cls.__name__}; that "
                    "worker's own error says why)."
                )
            )

    def gather(self, values: np.ndarray) -> np.ndarray:
        """Every worker's ``float64[n]`` (the same n on each), as ``[W, n]`` in rank order."""
        got = self.ps.all_gather(np.ascontiguousarray(values, np.float64))
        return np.asarray(got).reshape(self.world_size, -1)

    def attempt(self, step: Callable[[], object]) -> Exception | None:
        """Run ``step``; return its error for :meth:`agree` (a WriteError saying that nothing
        is left at the path), or None."""
        try:
            step()
        except WriteError as e:
            return WriteError(self.not_written(e))
        except Exception as e:  # agreed on next; re-raised on this worker as it is
            return e
        return None

    def temporary_dir(self) -> str:
        """The hidden sibling every worker writes into (its name drawn by rank 0)."""
        token = np.zeros(1, np.float64)
        if self.rank == 0:  # 48 random bits: exact in a float64
            token[0] = int.from_bytes(os.urandom(6), "big")
        token = self.ps.all_reduce_sum(token)
        return staging_dir(self.path, f"{int(token[0]):012x}")


def export_path(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute (a URI as it is)."""
    return _fileio.absolute(path).rstrip("/") or "/"


# what an export or a delta writes at its top level (a prefix holding only these and no
# manifest is what a killed export to an object store left)
_EXPORT_ENTRIES = {"embeddings", "manifest.json", "dense.pt2", "dense.onnx"}


def _killed_export(path: str) -> bool:
    """True when the object-store prefix ``path`` holds only what an export writes, without
    its ``manifest.json``: what a killed export left (the next export deletes it)."""
    if not _fileio.is_object_store(path) or not _fileio.is_dir(path):
        return False
    entries = {name for name, _ in _fileio.list_dir(path)}
    return entries <= _EXPORT_ENTRIES and "manifest.json" not in entries


def check_new_path(path: str | os.PathLike[str]) -> str:
    """Return ``path`` made absolute if nothing is there yet (or only what a killed export
    to an object store left, which the export deletes before writing).

    Raises:
        ArgumentError: ``path`` exists.
    """
    path = export_path(path)
    there = _fileio.exists(path) if _fileio.is_remote(path) else os.path.lexists(path)
    if there and not _killed_export(path):
        raise ArgumentError(f"Export path {path} already exists; choose a new directory.")
    return path


def make_shard_dir(tmp: str, rel: str) -> str:
    """Create one shard's directory inside ``tmp`` (its table's directory exists already).

    Raises:
        WriteError: it cannot be created.
    """
    full = os.path.join(tmp, rel)
    makedirs(full)
    return full


def save_npy(path: str, arr: np.ndarray) -> str:
    """Write ``arr`` to ``path`` (fsynced, no pickle); return its sha256.

    Raises:
        WriteError: the file cannot be written (names it).
    """
    write_file(path, lambda f: np.save(f, np.ascontiguousarray(arr), allow_pickle=False))
    return sha256_file(path)


def write_sharded(
    workers: Workers,
    table_dirs: Sequence[str],
    write_shards: Callable[[str], np.ndarray],
    finish: Callable[[str, np.ndarray], None],
) -> str:
    """Write an export from every worker (see the module docstring); return its path.

    Args:
        workers: the workers and the final path.
        table_dirs: directories rank 0 creates before the shards are written
            (relative: ``embeddings/<table>`` of every table).
        write_shards: ``write_shards(tmp)`` writes this worker's shard files into
            ``tmp`` and returns its summary, ``float64[n]`` (the same n on every worker).
        finish: rank 0's ``finish(tmp, summaries[W, n])`` writes the rest (graph, manifest).

    Raises:
        WriteError: a file cannot be written on some worker; nothing is left at the path.
        TnrecError: a step failed on some worker (its class, naming the rank).
    """
    tmp = workers.temporary_dir()
    summary: list[np.ndarray] = []

    def create() -> None:
        if _killed_export(workers.path):
            remove_tree(workers.path)
        makedirs(tmp)
        for rel in ("embeddings", *table_dirs):
            makedirs(os.path.join(tmp, rel))

    def shards() -> None:
        if not _fileio.is_object_store(tmp) and not _fileio.is_dir(tmp):
            raise WriteError(
                f"rank {workers.rank} does not see {tmp}, which rank 0 created: the export "
                "path must be on a file system every worker sees."
            )
        summary.append(np.asarray(write_shards(tmp), np.float64))

    def publish_all(summaries: np.ndarray) -> None:
        finish(tmp, summaries)
        for rel in (*table_dirs, "embeddings"):
            fsync_dir(os.path.join(tmp, rel))
        publish_dir(tmp, workers.path)

    try:
        workers.agree(workers.attempt(create) if workers.rank == 0 else None, "create " + tmp)
        workers.agree(workers.attempt(shards), "write its shards")
        summaries = workers.gather(summary[0])
        error = workers.attempt(lambda: publish_all(summaries)) if workers.rank == 0 else None
        workers.agree(error, "publish the export")
    except BaseException:
        if workers.rank == 0:  # every worker has left the step that failed
            remove_tree(tmp)
        raise
    return workers.path


# ---------------------------------------------------------------- what each worker wrote


def shard_summary(counts: Sequence[int], digests: Sequence[str]) -> list[float]:
    """One table's part of a worker's summary: its shard's counts, then each file's sha256."""
    return [*(float(c) for c in counts), *(v for d in digests for v in digest_values(d))]


def read_summaries(
    summaries: np.ndarray,
    tables: Sequence[str],
    counts: Sequence[str],
    files: Sequence[str],
    version: int,
) -> tuple[dict[str, str], dict[str, list[dict[str, int]]]]:
    """Decode every worker's summary (tables in ``tables`` order, each a :func:`shard_summary`).

    Args:
        summaries: ``float64[W, n]``, row r from worker r.
        tables: the table names, in the order the workers wrote them.
        counts: the names of the counts of a shard (``("count",)``).
        files: the file names of a shard, in summary order.
        version: the export's format version.

    Returns:
        ``(files, shards)``: ``{relative path: sha256}`` of every shard file and
        ``{table: [{count name: n} per shard]}``.
    """
    W = summaries.shape[0]
    stride = len(counts) + DIGEST_VALUES * len(files)
    if summaries.shape[1] != stride * len(tables):
        raise RuntimeError("internal error: the workers' summaries do not match their tables")
    digests: dict[str, str] = {}
    shards: dict[str, list[dict[str, int]]] = {t: [] for t in tables}
    for r in range(W):
        for i, table in enumerate(tables):
            block = summaries[r, i * stride : (i + 1) * stride]
            shards[table].append({c: int(block[j]) for j, c in enumerate(counts)})
            for j, name in enumerate(files):
                at = len(counts) + DIGEST_VALUES * j
                rel = f"{shard_dir(table, r, W, version)}/{name}"
                digests[rel] = values_digest(block[at : at + DIGEST_VALUES])
    return digests, shards
