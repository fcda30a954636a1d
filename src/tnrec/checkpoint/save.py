"""Writing a checkpoint generation: every worker's files, then rank 0 publishes.

On a file system with a rename (the local disk, HDFS) the generation is
written into ``DT/.tmp-GEN``, its manifest last, renamed to ``DT/GEN``, and
``_checkpoint`` replaced by rename. On an object store (``s3://``, ``gs://``
...), which has no rename, every file is written under its final key
``DT/GEN/...``, then the manifest (the checksums of all of them), then
``_checkpoint`` with one PUT: the pointer is the commit point. Either way a
reader trusts only what ``_checkpoint`` names, and a killed save leaves files
that no pointer names, which the next save deletes (on an object store: every
generation directory without a manifest, found by listing; the listing is
only ever used to clean up and to pick an unused number, never to find the
checkpoint to load).
"""

from __future__ import annotations

import base64
import contextlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec import _fileio
from tnrec._fileio import kill_point, sha256_file
from tnrec.checkpoint.layout import (
    DENSE,
    FORMAT,
    FORMAT_VERSION,
    GEN_DIR,
    MANIFEST,
    POINTER,
    TMP_DIR,
    lock_for_run,
    max_generation_on_disk,
    pointer_doc,
    read_pointer,
    scan_generations,
)
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    WriteError,
)
from tnrec.layers.spec import feature_spec, layers_spec
from tnrec.table import NUM_BUCKETS
from tnrec.table import files as table_files

if TYPE_CHECKING:
    from tnrec.layers.spec import CheckpointModel as Model
    from tnrec.ps import ParameterServer

# ---------------------------------------------------------------- save


def owned_buckets(rank: int, world: int) -> np.ndarray:
    return np.arange(NUM_BUCKETS) % world == rank


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def save(
    model: Model,
    model_dir: str,
    dt: str,
    *,
    resume: dict[str, Any] | None = None,
    position: dict[str, Any] | None = None,
    keep: int | None = None,
) -> str:
    """Write a new checkpoint generation of ``model`` for day ``dt``; return its directory.

    Every worker calls it (it contains barriers).

    Args:
        model: the model (its tables are this worker's shards).
        model_dir: the checkpoint root.
        dt: the day label (e.g. ``"2024-05-10"``).
        resume: resume state stored in the manifest (global step, day complete, ...).
        position: this worker's consumed input position (JSON-ready).
        keep: keep only this many newest generations (never the published one).

    Raises:
        ArgumentError: ``dt`` is not a plain directory name, or ``keep < 1``.
    """
    if not dt or "/" in dt or dt.startswith((".", "_")):
        raise ArgumentError(
            f"`dt` must be a plain directory name like '2024-05-10'. Received: {dt!r}."
        )
    if keep is not None and keep < 1:
        raise ArgumentError(f"`keep` must be >= 1 or None. Received: keep={keep!r}.")
    model_dir = _fileio.absolute(model_dir)
    ps = model.ps
    with lock_for_run(ps, model_dir):
        generation = _next_generation(ps, model_dir)
        tmp = _staging(model_dir, dt, generation)
        published = [False]
        try:
            _write_worker_files(model, tmp, generation, position)
            if ps.rank == 0:
                _publish_generation(model, model_dir, dt, generation, resume or {}, keep, published)
        except BaseException:
            if ps.rank == 0 and not published[0]:
                _fileio.remove_tree(tmp)
            raise
        ps.barrier("checkpoint: published")
    for table in model.tables.values():
        table.generation = generation + 1
    return os.path.join(model_dir, dt, str(generation))


def _staging(model_dir: str, dt: str, generation: int) -> str:
    """Where generation ``generation`` of day ``dt`` is written before it is published."""
    name = str(generation) if _fileio.is_object_store(model_dir) else f".tmp-{generation}"
    return os.path.join(model_dir, dt, name)


def _next_generation(ps: ParameterServer, model_dir: str) -> int:
    """Agree on the next generation number: one more than any on disk or in the pointer.

    Rank 0 also removes what killed saves left: temporary directories, and on
    an object store generation directories without a manifest (the lock, or on
    an object store the one-run-per-model-dir rule, guarantees that no other
    run is writing them).
    """
    gen_vec = np.zeros(1, np.float64)
    if ps.rank == 0:
        _fileio.makedirs(model_dir)
        pointer = read_pointer(model_dir)
        _remove_leftovers(model_dir, pointer.generation if pointer else 0)
        gen_vec[0] = max(max_generation_on_disk(model_dir), pointer.generation if pointer else 0)
        gen_vec[0] += 1
    return int(ps.all_reduce_sum(gen_vec)[0])


def _remove_leftovers(model_dir: str, published: int) -> None:
    """Delete what killed saves and prunes left in ``model_dir`` (never a complete generation,
    never the published one)."""
    if not _fileio.is_dir(model_dir):
        return
    object_store = _fileio.is_object_store(model_dir)
    for dt, is_day in _fileio.list_dir(model_dir):
        if dt.startswith((".", "_")) or not is_day:
            continue
        day = os.path.join(model_dir, dt)
        for entry, _ in _fileio.list_dir(day):
            full = os.path.join(day, entry)
            if TMP_DIR.match(entry) or entry.startswith(".pruned-"):
                _fileio.remove_tree(full)
            elif (
                object_store
                and GEN_DIR.match(entry)
                and int(entry) != published
                and not _fileio.is_file(os.path.join(full, MANIFEST))
            ):
                _fileio.remove_tree(full)


def _write_worker_files(
    model: Model, tmp: str, generation: int, position: dict[str, Any] | None
) -> None:
    """Write this worker's table shards and worker file (rank 0: the dense file too)."""
    ps = model.ps
    rank, world = ps.rank, ps.world_size
    if rank == 0:
        _fileio.makedirs(os.path.join(tmp, "workers"))
    ps.barrier("checkpoint: create directory")
    for name in sorted(model.tables):
        part = os.path.join(tmp, "sparse", name, f"part-{rank:05d}-of-{world:05d}")
        table_files.save(model.tables[name], part, order="bucket")
        kill_point(f"after-table:{name}")
    worker = {"rank": rank, "position": position, "torch_rng": _rng_state()}
    _fileio.write_json(os.path.join(tmp, "workers", f"rank-{rank}.json"), worker, atomic=False)
    kill_point("after-worker-file")
    if rank == 0:
        dense = {"model": model.state_dict()}
        if model.optimizer is not None:
            dense["optimizer"] = model.optimizer.state_dict()
        _fileio.write_file(os.path.join(tmp, DENSE), lambda f: torch.save(dense, f))
        kill_point("after-dense")
    ps.barrier("checkpoint: files written")


def _publish_generation(
    model: Model,
    model_dir: str,
    dt: str,
    generation: int,
    resume: dict[str, Any],
    keep: int | None,
    published: list[bool],
) -> None:
    """Rank 0: write the manifest, rename the directory into place, move ``_checkpoint``
    (on an object store: write the manifest, then ``_checkpoint``); ``published[0]`` is set
    once the pointer names the new generation."""
    tmp = _staging(model_dir, dt, generation)
    manifest = _manifest(model, tmp, dt, generation, model.ps.world_size, resume)
    _fileio.write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
    final = os.path.join(model_dir, dt, str(generation))
    kill_point("before-rename")
    _fileio.publish_dir(tmp, final)
    kill_point("after-rename")
    pointer = _fileio.dumps_checked(pointer_doc(dt, generation))
    if _fileio.is_object_store(model_dir):  # one PUT replaces the object whole
        kill_point("before-publish")
        _fileio.write_bytes(os.path.join(model_dir, POINTER), pointer)
    else:
        pointer_tmp = os.path.join(model_dir, f".{POINTER}.tmp")
        try:
            _fileio.write_bytes(pointer_tmp, pointer)
            kill_point("before-publish")
            _fileio.publish(pointer_tmp, os.path.join(model_dir, POINTER))
        finally:
            with contextlib.suppress(WriteError):
                _fileio.remove_file(pointer_tmp)
    published[0] = True
    kill_point("after-publish")
    if keep is not None:
        _prune(model_dir, keep, generation)


def _manifest(
    model: Model, tmp: str, dt: str, generation: int, world: int, resume: dict[str, Any]
) -> dict[str, Any]:
    tables = {}
    for name, table in sorted(model.tables.items()):
        parts = []
        for r in range(world):
            rel = os.path.join("sparse", name, f"part-{r:05d}-of-{world:05d}")
            header = os.path.join(tmp, rel, table_files.HEADER)
            if not _fileio.is_file(header):
                raise CheckpointError(f"Worker {r} did not write {header}; not publishing.")
            parts.append({"dir": rel, "rank": r, "header_sha256": sha256_file(header)})
        head = table_files.header_of(table)
        tables[name] = {
            k: head[k] for k in ("dim", "seed", "initializer", "optimizer", "policy")
        } | {"parts": parts}
    files = {DENSE: sha256_file(os.path.join(tmp, DENSE))}
    for r in range(world):
        rel = os.path.join("workers", f"rank-{r}.json")
        files[rel] = sha256_file(os.path.join(tmp, rel))
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "dt": dt,
        "generation": generation,
        "world_size": world,
        "model_class": type(model).__name__,
        "feature_spec": feature_spec(model),
        "layers": layers_spec(model),
        "tables": tables,
        "files": files,
        "resume": resume,
    }


def _prune(model_dir: str, keep: int, published: int) -> None:
    """Delete complete generations older than the ``keep`` newest; never the published one
    nor any newer one."""
    gens = [(dt, g) for dt, g, ok in scan_generations(model_dir) if ok and g <= published]
    for dt, g in gens[: max(len(gens) - keep, 0)]:
        if g == published:
            continue
        full = os.path.join(model_dir, dt, str(g))
        if _fileio.is_object_store(model_dir):
            # the manifest first: a kill after it leaves a generation without one, which
            # the next save deletes
            _fileio.remove_file(os.path.join(full, MANIFEST))
            _fileio.remove_tree(full)
        else:
            # renamed aside first: a kill during rmtree leaves a hidden directory, never a
            # numbered one without its manifest (which would read as damage)
            aside = os.path.join(model_dir, dt, f".pruned-{g}")
            _fileio.publish(full, aside)
            _fileio.remove_tree(aside)
