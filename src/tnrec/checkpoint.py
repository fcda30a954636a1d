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
        sparse/<table>/part-<r>-of-<W>/   worker r's shard: .npy files sorted by (bucket,
                                   key) with bucket offsets, its own table.json + sha256s

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
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec import _fileio
from tnrec._fileio import check_file, fsync_dir, kill_point, sha256_file
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    MismatchError,
    WriteError,
)
from tnrec.feature_column import canonical_spec
from tnrec.layers.spec import feature_spec, layers_spec
from tnrec.table import NUM_BUCKETS
from tnrec.table import files as table_files

if TYPE_CHECKING:
    from tnrec.layers.spec import CheckpointModel as Model
    from tnrec.ps import ParameterServer

FORMAT = "tnrec.checkpoint"
FORMAT_VERSION = 2
POINTER = "_checkpoint"
POINTER_FORMAT = "tnrec.checkpoint_pointer"
POINTER_VERSION = 2
MANIFEST = "manifest.json"
DENSE = "dense.pt"
_GEN = re.compile(r"^[0-9]+$")
_TMP = re.compile(r"^\.tmp-([0-9]+)$")


# ---------------------------------------------------------------- locating checkpoints


@dataclass(frozen=True)
class Pointer:
    """What ``_checkpoint`` names, checked against itself and the disk."""

    dt: str
    generation: int
    path: str


def _check_dt(dt: Any, where: str) -> str:
    if not isinstance(dt, str) or not dt or "/" in dt or "\\" in dt or dt.startswith((".", "_")):
        raise CheckpointError(f"{where}: {dt!r} is not a day label (a plain directory name).")
    return dt


def _scan(model_dir: str) -> list[tuple[str, int, bool]]:
    """Every ``(dt, generation, complete)`` directory on disk, oldest generation first.

    Complete means it holds a manifest (it was renamed into place whole).
    """
    found: list[tuple[str, int, bool]] = []
    if not os.path.isdir(model_dir):
        return found
    for dt in os.listdir(model_dir):
        day = os.path.join(model_dir, dt)
        if dt.startswith((".", "_")) or not os.path.isdir(day):
            continue
        for g in os.listdir(day):
            full = os.path.join(day, g)
            if _GEN.match(g) and os.path.isdir(full):
                found.append((dt, int(g), os.path.isfile(os.path.join(full, MANIFEST))))
    return sorted(found, key=lambda x: (x[1], x[0]))


def _max_generation_on_disk(model_dir: str) -> int:
    """The largest generation number of a directory in ``model_dir`` (temporary ones aside:
    a killed save's ``.tmp-N`` is removed and its number reused)."""
    return max((g for _, g, _ in _scan(model_dir)), default=0)


def read_pointer(model_dir: str) -> Pointer | None:
    """Read and check ``_checkpoint``; None when the model dir holds no complete checkpoint.

    The pointer's ``dt``, ``generation`` and ``dir`` must agree with each other and
    with the manifest of the directory they name, which must lie inside ``model_dir``.

    Raises:
        CheckpointError: the pointer is damaged or disagrees with the disk, or it is
            missing while complete checkpoints exist (the message names the newest
            complete one and how to publish it again).
    """
    fname = os.path.join(model_dir, POINTER)
    if not os.path.exists(fname):
        complete = [(dt, g) for dt, g, ok in _scan(model_dir) if ok]
        if complete:
            dt, g = complete[-1]
            newest = os.path.join(model_dir, dt, str(g))
            raise CheckpointError(
                f"{model_dir} holds {len(complete)} complete checkpoint(s) but no {POINTER} "
                f"pointer, so it is not known which one is current; the newest complete one is "
                f"{newest}. Publish the one to continue from with `tnrec checkpoint publish "
                f"{newest}` (or tnrec.checkpoint.publish), then run again."
            )
        return None
    doc = _fileio.read_versioned_json(
        fname, POINTER_FORMAT, POINTER_VERSION, what="checkpoint pointer", legacy=_legacy_pointer
    )
    dt = _check_dt(_fileio.field(doc, "dt", str, fname), fname)
    gen = _fileio.field(doc, "generation", int, fname)
    rel = _fileio.field(doc, "dir", str, fname)
    if gen < 1 or rel != f"{dt}/{gen}":
        raise CheckpointError(
            f"{fname} disagrees with itself: dir {rel!r}, dt {dt!r}, generation {gen}; "
            f"restore it with `tnrec checkpoint publish {os.path.join(model_dir, rel)}`."
        )
    path = os.path.join(model_dir, dt, str(gen))
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise CheckpointError(f"{fname} names {path}, which has no {MANIFEST}.")
    manifest = read_manifest(path)
    if manifest["dt"] != dt or manifest["generation"] != gen:
        raise CheckpointError(
            f"{fname} names day {dt!r} generation {gen}, but {path}/{MANIFEST} is day "
            f"{manifest['dt']!r} generation {manifest['generation']}; refusing to guess."
        )
    return Pointer(dt, gen, path)


def _legacy_pointer(doc: dict[str, Any]) -> bool:
    """Pointers written before checksums: no ``format`` field."""
    return "format" not in doc


def generations(model_dir: str) -> list[tuple[str, int]]:
    """Return every published ``(dt, generation)`` in ``model_dir``, oldest first.

    Published means complete and not newer than the generation ``_checkpoint``
    names: a directory renamed into place by a save that was killed before it
    moved ``_checkpoint`` is not published (it is kept, and the next save takes
    the next free generation number).
    """
    pointer = read_pointer(model_dir)
    last = pointer.generation if pointer is not None else 0
    found = _scan(model_dir)
    for dt, g, ok in found:
        if not ok and g <= last:
            where = os.path.join(model_dir, dt, str(g), MANIFEST)
            raise CheckpointError(
                f"{where} is missing: generation {g} is older than the published one, so it "
                "was complete once and has been damaged since. Restore the file, or delete "
                f"{os.path.dirname(where)} if that generation is not needed."
            )
    return [(dt, g) for dt, g, ok in found if ok and g <= last]


def latest(model_dir: str, dt: str | None = None) -> str | None:
    """Return the directory of the last complete checkpoint (of day ``dt`` if given), or None.

    Without ``dt`` this is the directory ``_checkpoint`` names. With ``dt``, the
    newest published generation of that day.

    Raises:
        CheckpointError: ``_checkpoint`` is unreadable, disagrees with the disk, or is
            missing beside complete checkpoints (see :func:`read_pointer`).
    """
    if dt is None:
        pointer = read_pointer(model_dir)
        return pointer.path if pointer is not None else None
    gens = [g for d, g in generations(model_dir) if d == dt]
    return os.path.join(model_dir, dt, str(gens[-1])) if gens else None


def publish(path: str) -> str:
    """Make the complete checkpoint directory ``path`` (``MODEL_DIR/DT/GEN``) the current one.

    Rewrites ``MODEL_DIR/_checkpoint`` to name it, after checking its manifest and
    the checksum of every file it lists. Use it when ``_checkpoint`` was lost or
    damaged, or to roll back to an older generation (newer ones are kept; the next
    save takes the next free generation number).

    Returns:
        The pointer's path.

    Raises:
        CheckpointError: ``path`` is not a complete, intact checkpoint generation.
    """
    path = os.path.abspath(os.fspath(path))
    gen_dir, dt = os.path.basename(path), os.path.basename(os.path.dirname(path))
    model_dir = os.path.dirname(os.path.dirname(path))
    if not _GEN.match(gen_dir):
        raise CheckpointError(f"{path} is not a checkpoint generation directory (DIR/DT/GEN).")
    manifest = read_manifest(path)
    if manifest["dt"] != dt or manifest["generation"] != int(gen_dir):
        raise CheckpointError(
            f"{path}/{MANIFEST} is day {manifest['dt']!r} generation {manifest['generation']}, "
            "not the directory it lies in."
        )
    verify(path)
    with hold_lock(model_dir):
        _fileio.write_json(os.path.join(model_dir, POINTER), _pointer_doc(dt, int(gen_dir)))
    return os.path.join(model_dir, POINTER)


def _pointer_doc(dt: str, generation: int) -> dict[str, Any]:
    return {
        "format": POINTER_FORMAT,
        _fileio.VERSION_KEY: POINTER_VERSION,
        "dt": dt,
        "dir": f"{dt}/{generation}",
        "generation": generation,
    }


def verify(path: str) -> dict[str, Any]:
    """Check a checkpoint directory: its manifest and the sha256 of every file it names.

    Returns:
        The manifest.

    Raises:
        CheckpointError: a file is missing, unreadable or corrupt (ChecksumError).
    """
    manifest = read_manifest(path)
    for rel, digest in manifest["files"].items():
        _check_file(path, rel, digest)
    for doc in manifest["tables"].values():
        for part in doc["parts"]:
            _check_file(path, os.path.join(part["dir"], table_files.HEADER), part["header_sha256"])
            table_files.verify(os.path.join(path, part["dir"]))
    return manifest


# ---------------------------------------------------------------- the model-dir lock

_held: dict[str, list[Any]] = {}


@contextlib.contextmanager
def hold_lock(model_dir: str) -> Iterator[None]:
    """Hold the exclusive lock of ``model_dir`` (re-entrant within a process).

    Two runs writing one model dir would delete each other's temporary files;
    the second one gets a WriteError naming the first one's pid instead.
    """
    key = os.path.realpath(model_dir)
    entry = _held.get(key)
    if entry is None:
        lock = _fileio.DirLock(model_dir, "model dir")
        lock.acquire()
        entry = _held[key] = [lock, 0]
    entry[1] += 1
    try:
        yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            entry[0].release()
            del _held[key]


@contextlib.contextmanager
def lock_for_run(ps: ParameterServer, model_dir: str) -> Iterator[None]:
    """Rank 0 holds ``model_dir``'s lock for the block; every worker fails together if it can't.

    Raises:
        WriteError: another process holds the lock (on rank 0: its message; elsewhere: says so).
    """
    failed = np.zeros(1, np.float64)
    ctx: Any = contextlib.nullcontext()
    error: WriteError | None = None
    if ps.rank == 0:
        try:
            ctx = hold_lock(model_dir)
            ctx.__enter__()
        except WriteError as e:
            error, failed[0] = e, 1.0
            ctx = contextlib.nullcontext()
    if ps.world_size > 1:
        failed = ps.all_reduce_sum(failed)
    if error is not None:
        raise error
    if failed[0] > 0:
        raise WriteError(f"The model dir {model_dir} is in use by another run (see rank 0).")
    with contextlib.ExitStack() as stack:
        stack.push(ctx.__exit__)
        yield


# ---------------------------------------------------------------- save


def _owned_buckets(rank: int, world: int) -> np.ndarray:
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
    ps = model.ps
    with lock_for_run(ps, model_dir):
        generation = _next_generation(ps, model_dir)
        tmp = os.path.join(model_dir, dt, f".tmp-{generation}")
        try:
            _write_worker_files(model, tmp, generation, position)
            if ps.rank == 0:
                _publish_generation(model, model_dir, dt, generation, resume or {}, keep)
        except BaseException:
            if ps.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        ps.barrier("checkpoint: published")
    for table in model.tables.values():
        table.generation = generation + 1
    return os.path.join(model_dir, dt, str(generation))


def _next_generation(ps: ParameterServer, model_dir: str) -> int:
    """Agree on the next generation number: one more than any on disk or in the pointer.

    Rank 0 also removes temporary directories left by killed saves (the lock
    guarantees that no other run is writing them).
    """
    gen_vec = np.zeros(1, np.float64)
    if ps.rank == 0:
        _fileio.makedirs(model_dir)
        pointer = read_pointer(model_dir)
        gen_vec[0] = max(_max_generation_on_disk(model_dir), pointer.generation if pointer else 0)
        gen_vec[0] += 1
        for dt in os.listdir(model_dir):
            day = os.path.join(model_dir, dt)
            if not dt.startswith((".", "_")) and os.path.isdir(day):
                for entry in os.listdir(day):
                    if _TMP.match(entry) or entry.startswith(".pruned-"):
                        shutil.rmtree(os.path.join(day, entry), ignore_errors=True)
    return int(ps.all_reduce_sum(gen_vec)[0])


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
) -> None:
    """Rank 0: write the manifest, rename the directory into place, move ``_checkpoint``."""
    tmp = os.path.join(model_dir, dt, f".tmp-{generation}")
    manifest = _manifest(model, tmp, dt, generation, model.ps.world_size, resume)
    _fileio.write_json(os.path.join(tmp, MANIFEST), manifest, atomic=False)
    fsync_dir(tmp)
    final = os.path.join(model_dir, dt, str(generation))
    kill_point("before-rename")
    _fileio.publish(tmp, final)
    kill_point("after-rename")
    pointer_tmp = os.path.join(model_dir, f".{POINTER}.tmp")
    try:
        _fileio.write_bytes(pointer_tmp, _fileio.dumps_checked(_pointer_doc(dt, generation)))
        kill_point("before-publish")
        _fileio.publish(pointer_tmp, os.path.join(model_dir, POINTER))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(pointer_tmp)
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
            if not os.path.isfile(header):
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
    gens = [(dt, g) for dt, g, ok in _scan(model_dir) if ok and g <= published]
    for dt, g in gens[: max(len(gens) - keep, 0)]:
        if g != published:
            # renamed aside first: a kill during rmtree leaves a hidden directory, never a
            # numbered one without its manifest (which would read as damage)
            aside = os.path.join(model_dir, dt, f".pruned-{g}")
            os.rename(os.path.join(model_dir, dt, str(g)), aside)
            shutil.rmtree(aside, ignore_errors=True)


# ---------------------------------------------------------------- load


@dataclass
class LoadReport:
    """What :func:`load` did: the directory, and what was loaded, skipped or left fresh."""

    path: str
    generation: int
    loaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    initialized: list[str] = field(default_factory=list)
    resume: dict[str, Any] = field(default_factory=dict)
    position: dict[str, Any] | None = None


def read_manifest(path: str) -> dict[str, Any]:
    """Read a checkpoint directory's manifest and check its checksum and schema.

    Raises:
        CheckpointError: missing, unreadable, damaged (ChecksumError), another format
            version (FormatVersionError), or a field of the wrong type or value (named).
    """
    fname = os.path.join(path, MANIFEST)
    manifest = _fileio.read_versioned_json(
        fname, FORMAT, FORMAT_VERSION, what="checkpoint manifest", legacy=_legacy_manifest
    )
    _check_manifest(manifest, fname)
    return manifest


def _legacy_manifest(doc: dict[str, Any]) -> bool:
    """Manifests of format version 1 carry no checksum; their schema is still checked."""
    return doc.get("format") == FORMAT and doc.get(_fileio.VERSION_KEY) == 1


def _relative(rel: Any, where: str) -> str:
    if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/") or not rel:
        raise CheckpointError(f"{where}: {rel!r} is not a path inside the checkpoint directory.")
    return rel


def _check_manifest(m: dict[str, Any], fname: str) -> None:
    """Check every manifest field that loading, export and inspection use."""
    f = _fileio.field
    _check_dt(f(m, "dt", str, fname), fname)
    if f(m, "generation", int, fname) < 1 or f(m, "world_size", int, fname) < 1:
        raise CheckpointError(f"{fname}: generation and world_size must be >= 1.")
    for name in ("feature_spec", "layers", "tables", "files", "resume"):
        f(m, name, dict, fname)
    for rel, digest in m["files"].items():
        _relative(rel, fname)
        if not isinstance(digest, str):
            raise CheckpointError(f"{fname}: files[{rel!r}] must be a sha256 string.")
    if DENSE not in m["files"]:
        raise CheckpointError(f"{fname}: field 'files' does not name {DENSE}.")
    for name, doc in m["tables"].items():
        where = f"{fname}: table {name!r}"
        if not isinstance(doc, dict):
            raise CheckpointError(f"{where} must be an object.")
        if f(doc, "dim", int, where) < 1:
            raise CheckpointError(f"{where}: dim must be >= 1.")
        if not isinstance(f(doc, "optimizer", dict, where).get("type"), str):
            raise CheckpointError(f"{where}: field 'optimizer' has no 'type'.")
        parts = f(doc, "parts", list, where)
        ranks = []
        for part in parts:
            if not isinstance(part, dict):
                raise CheckpointError(f"{where}: every part must be an object.")
            _relative(f(part, "dir", str, where), where)
            ranks.append(f(part, "rank", int, where))
            f(part, "header_sha256", str, where)
        if sorted(ranks) != list(range(len(parts))) or not parts:
            raise CheckpointError(f"{where}: parts must be ranks 0..W-1. Received: {ranks}.")
    resume = m["resume"]
    step = resume.get("global_step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"{fname}: resume.global_step must be an int >= 0. Received: {step!r}."
        )
    for key in ("dt", "last_decayed_day"):
        if resume.get(key) is not None:
            _check_dt(resume[key], f"{fname}: resume.{key}")
    if not isinstance(resume.get("day_complete", False), bool):
        raise CheckpointError(f"{fname}: resume.day_complete must be true or false.")


def _check_file(path: str, rel: str, digest: str) -> str:
    return check_file(os.path.join(path, rel), digest, "Checkpoint", MANIFEST)


def load(
    model: Model,
    model_dir: str,
    dt: str | None = None,
    *,
    partial: bool = False,
    path: str | None = None,
) -> LoadReport | None:
    """Load the last complete checkpoint (of day ``dt``) into ``model``; None if there is none.

    Every worker calls it and reads only the rows of the buckets it owns.
    Everything is validated before the model changes: a mismatch or a
    corrupt file raises and leaves the model as it was.

    Args:
        model: a built model (its tables are replaced by the checkpoint's).
        model_dir: the checkpoint root.
        dt: a day, or None for the checkpoint ``_checkpoint`` names.
        partial: warm start: load tables matching by name and dim (and optimizer
            type) and dense tensors matching by name and shape; report the rest.
        path: load exactly this generation directory instead.

    Raises:
        CheckpointError: unreadable, missing or corrupt files (ChecksumError),
            unknown format version (FormatVersionError), or a checkpoint of
            another model (MismatchError) when ``partial`` is False.
    """
    path = path if path is not None else latest(model_dir, dt)
    if path is None:
        return None
    manifest = read_manifest(path)
    report = LoadReport(path=path, generation=int(manifest["generation"]))
    plan = _plan_tables(model, manifest, os.path.join(path, MANIFEST), partial, report)
    mine = _owned_buckets(model.ps.rank, model.ps.world_size)
    parts = {name: _parts_to_read(path, saved, mine) for name, saved in plan.items()}
    dense_file, dense = _read_dense(path, manifest)
    state = _dense_plan(model, dense.get("model", {}), partial, report, dense_file)
    rng = _read_worker_state(path, manifest, model.ps, report)
    # everything is validated; from here on the model changes
    _apply_tables(model, parts, mine, report)
    _apply_dense(model, state, dense, dense_file, partial, report)
    if rng is not None:  # dropout and other torch randomness continue as if never stopped
        rng_bytes = np.frombuffer(base64.b64decode(rng), dtype=np.uint8).copy()
        torch.set_rng_state(torch.from_numpy(rng_bytes))
    report.resume = dict(manifest.get("resume") or {})
    return report


def _plan_tables(
    model: Model, manifest: dict[str, Any], fname: str, partial: bool, report: LoadReport
) -> dict[str, dict[str, Any]]:
    """Validate the manifest against the model; return the saved tables to load, by name.

    Raises:
        MismatchError: a table or the feature spec differs (unless ``partial``).
    """
    plan = {}
    for name, table in sorted(model.tables.items()):
        saved = manifest["tables"].get(name)
        problem = None
        if saved is None:
            problem = "not in the checkpoint"
        elif int(saved["dim"]) != table.dim:
            problem = f"saved dim {saved['dim']} != model dim {table.dim}"
        elif saved["optimizer"].get("type") != type(table.optimizer).__name__:
            problem = (
                f"saved optimizer {saved['optimizer'].get('type')} != model optimizer "
                f"{type(table.optimizer).__name__}"
            )
        if problem is not None:
            if not partial:
                raise MismatchError(f'{fname}: table "{name}": {problem}.')
            report.initialized.append(f"table {name} ({problem})")
            continue
        plan[name] = saved
    if not partial and (
        canonical_spec(manifest.get("feature_spec")) != feature_spec(model)
        or manifest.get("layers") != layers_spec(model)
    ):
        raise MismatchError(
            f"{fname}: the checkpoint's feature spec or embedding layers differ from the "
            "model's (another model, or changed columns); use partial=True to warm-start."
        )
    if partial:
        report.skipped += [
            f"table {n} (not in the model)" for n in manifest["tables"] if n not in model.tables
        ]
    return plan


def _parts_to_read(
    path: str, saved: dict[str, Any], mine: np.ndarray
) -> list[tuple[str, dict[str, Any]]]:
    """The parts of one saved table that hold some of this worker's buckets, each verified:
    ``(part directory, its checked header)``."""
    reads = []
    W = len(saved["parts"])
    for part in saved["parts"]:
        if not (mine & _owned_buckets(int(part["rank"]), W)).any():
            continue  # this part holds none of my buckets
        full = _check_file(
            path, os.path.join(part["dir"], table_files.HEADER), part["header_sha256"]
        )
        reads.append((os.path.dirname(full), table_files.verify(os.path.dirname(full))))
    return reads


def _read_dense(path: str, manifest: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check and read ``dense.pt`` (tensors and numbers only: ``weights_only=True``)."""
    dense_file = _check_file(path, DENSE, manifest["files"][DENSE])
    try:
        dense = torch.load(dense_file, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises several types for a bad file
        raise CheckpointError(f"Cannot read {dense_file}: {e}.") from None
    if not isinstance(dense, dict):
        raise CheckpointError(f"{dense_file} does not hold a dict of dense state.")
    return dense_file, dense


def _read_worker_state(
    path: str, manifest: dict[str, Any], ps: ParameterServer, report: LoadReport
) -> str | None:
    """This worker's input position (into ``report``) and torch RNG state, when the
    checkpoint was written by as many workers (otherwise positions do not apply)."""
    worker_rel = os.path.join("workers", f"rank-{ps.rank}.json")
    if int(manifest["world_size"]) != ps.world_size or worker_rel not in manifest["files"]:
        return None
    worker = _read_worker(_check_file(path, worker_rel, manifest["files"][worker_rel]))
    report.position = worker.get("position")
    rng = worker.get("torch_rng")
    return rng if isinstance(rng, str) else None


def _apply_tables(
    model: Model,
    parts: dict[str, list[tuple[str, dict[str, Any]]]],
    mine: np.ndarray,
    report: LoadReport,
) -> None:
    """Fresh tables, filled with this worker's buckets of every verified part."""
    model.build_tables()
    for name, reads in parts.items():
        table = model.tables[name]
        for part_dir, header in reads:
            table_files.load_into(table, part_dir, buckets=mine, verified=header)
        report.loaded.append(f"table {name}")
    for table in model.tables.values():
        table.generation = report.generation + 1


def _apply_dense(
    model: Model,
    state: dict[str, torch.Tensor],
    dense: dict[str, Any],
    dense_file: str,
    partial: bool,
    report: LoadReport,
) -> None:
    """Dense parameters and optimizer state, then the same on every worker."""
    model.load_state_dict(state, strict=not partial)
    if model.optimizer is not None and "optimizer" in dense and not report.initialized:
        try:
            model.optimizer.load_state_dict(dense["optimizer"])
        except (ValueError, KeyError) as e:
            if not partial:
                raise MismatchError(
                    f"{dense_file}: the dense optimizer state does not fit: {e}."
                ) from None
            report.initialized.append("dense optimizer state")
    model.ps.broadcast_parameters([*model.parameters(), *model.buffers()])


def _read_worker(fname: str) -> dict[str, Any]:
    """A worker file: ``position`` (the reader's, or None) and ``torch_rng`` (base64)."""
    doc = _fileio.read_json(fname, "checkpoint worker file")
    if not isinstance(doc, dict):
        raise CheckpointError(f"The checkpoint worker file {fname} is damaged: not an object.")
    if doc.get("position") is not None and not isinstance(doc["position"], dict):
        raise CheckpointError(f"{fname}: field 'position' must be an object or null.")
    rng = doc.get("torch_rng")
    if rng is not None:
        try:
            base64.b64decode(rng, validate=True)
        except (TypeError, ValueError):
            raise CheckpointError(f"{fname}: field 'torch_rng' is not base64.") from None
    return {k: v for k, v in doc.items() if k != _fileio.CHECKSUM}


def _dense_plan(
    model: Model, saved: dict[str, Any], partial: bool, report: LoadReport, fname: str
) -> dict[str, torch.Tensor]:
    own = model.state_dict()
    state = {}
    for k, v in own.items():
        got = saved.get(k)
        if got is None or tuple(got.shape) != tuple(v.shape):
            why = "missing" if got is None else f"shape {tuple(got.shape)} != {tuple(v.shape)}"
            if not partial:
                raise MismatchError(f"{fname}: dense tensor {k!r}: {why}.")
            report.initialized.append(f"dense {k} ({why})")
            state[k] = v
        else:
            state[k] = got
            report.loaded.append(f"dense {k}")
    for k in saved:
        if k not in own:
            if not partial:
                raise MismatchError(f"{fname}: dense tensor {k!r} is not in the model.")
            report.skipped.append(f"dense {k} (not in the model)")
    return state
