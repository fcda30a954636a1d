"""Where a model dir's checkpoints are: generations, the pointer, manifests, the lock."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tnrec import _fileio
from tnrec._fileio import check_file
from tnrec.errors import (
    CheckpointError,
    WriteError,
)
from tnrec.table import files as table_files

if TYPE_CHECKING:
    from tnrec.ps import ParameterServer

FORMAT = "tnrec.checkpoint"
FORMAT_VERSION = 2
POINTER = "_checkpoint"
POINTER_FORMAT = "tnrec.checkpoint_pointer"
POINTER_VERSION = 2
MANIFEST = "manifest.json"
DENSE = "dense.pt"
GEN_DIR = re.compile(r"^[0-9]+$")
TMP_DIR = re.compile(r"^\.tmp-([0-9]+)$")


# ---------------------------------------------------------------- locating checkpoints


@dataclass(frozen=True)
class Pointer:
    """What ``_checkpoint`` names, checked against itself and the disk."""

    dt: str
    generation: int
    path: str


def check_dt(dt: Any, where: str) -> str:
    if not isinstance(dt, str) or not dt or "/" in dt or "\\" in dt or dt.startswith((".", "_")):
        raise CheckpointError(f"{where}: {dt!r} is not a day label (a plain directory name).")
    return dt


def scan_generations(model_dir: str) -> list[tuple[str, int, bool]]:
    """Every ``(dt, generation, complete)`` directory on disk, oldest generation first.

    Complete means it holds a manifest (it was renamed into place whole; on an
    object store, its manifest was written after every other file).
    """
    found: list[tuple[str, int, bool]] = []
    if not _fileio.is_dir(model_dir):
        return found
    for dt, is_day in _fileio.list_dir(model_dir):
        if dt.startswith((".", "_")) or not is_day:
            continue
        day = os.path.join(model_dir, dt)
        for g, is_gen in _fileio.list_dir(day):
            if GEN_DIR.match(g) and is_gen:
                complete = _fileio.is_file(os.path.join(day, g, MANIFEST))
                found.append((dt, int(g), complete))
    return sorted(found, key=lambda x: (x[1], x[0]))


def max_generation_on_disk(model_dir: str) -> int:
    """The largest generation number of a directory in ``model_dir`` (temporary ones aside:
    a killed save's ``.tmp-N`` is removed and its number reused)."""
    return max((g for _, g, _ in scan_generations(model_dir)), default=0)


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
    if not _fileio.exists(fname):
        complete = [(dt, g) for dt, g, ok in scan_generations(model_dir) if ok]
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
    dt = check_dt(_fileio.field(doc, "dt", str, fname), fname)
    gen = _fileio.field(doc, "generation", int, fname)
    rel = _fileio.field(doc, "dir", str, fname)
    if gen < 1 or rel != f"{dt}/{gen}":
        raise CheckpointError(
            f"{fname} disagrees with itself: dir {rel!r}, dt {dt!r}, generation {gen}; "
            f"restore it with `tnrec checkpoint publish {os.path.join(model_dir, rel)}`."
        )
    path = os.path.join(model_dir, dt, str(gen))
    if not _fileio.is_file(os.path.join(path, MANIFEST)):
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
    the next free generation number). On an object store a generation without
    its manifest is what a killed save or prune left: it is not listed, and the
    next save deletes it.
    """
    pointer = read_pointer(model_dir)
    last = pointer.generation if pointer is not None else 0
    found = scan_generations(model_dir)
    for dt, g, ok in found:
        if not ok and g <= last and not _fileio.is_object_store(model_dir):
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
    path = _fileio.absolute(path).rstrip("/")
    gen_dir, dt = os.path.basename(path), os.path.basename(os.path.dirname(path))
    model_dir = os.path.dirname(os.path.dirname(path))
    if not GEN_DIR.match(gen_dir):
        raise CheckpointError(f"{path} is not a checkpoint generation directory (DIR/DT/GEN).")
    manifest = read_manifest(path)
    if manifest["dt"] != dt or manifest["generation"] != int(gen_dir):
        raise CheckpointError(
            f"{path}/{MANIFEST} is day {manifest['dt']!r} generation {manifest['generation']}, "
            "not the directory it lies in."
        )
    verify(path)
    with hold_lock(model_dir):
        _fileio.write_json(os.path.join(model_dir, POINTER), pointer_doc(dt, int(gen_dir)))
    return os.path.join(model_dir, POINTER)


def pointer_doc(dt: str, generation: int) -> dict[str, Any]:
    return {
        "format": POINTER_FORMAT,
        _fileio.VERSION_KEY: POINTER_VERSION,
        "dt": dt,
        "dir": f"{dt}/{generation}",
        "generation": generation,
    }


def verify(path: str) -> dict[str, Any]:
    """Check a checkpoint directory: its manifest and the checksum of every file it names.

    Returns:
        The manifest.

    Raises:
        CheckpointError: a file is missing, unreadable or corrupt (ChecksumError).
    """
    manifest = read_manifest(path)
    for rel, digest in manifest["files"].items():
        check_listed_file(path, rel, digest)
    for doc in manifest["tables"].values():
        for part in doc["parts"]:
            check_listed_file(
                path, os.path.join(part["dir"], table_files.HEADER), part["header_sha256"]
            )
            table_files.verify(os.path.join(path, part["dir"]))
    return manifest


# ---------------------------------------------------------------- the model-dir lock

_held: dict[str, list[Any]] = {}


@contextlib.contextmanager
def hold_lock(model_dir: str) -> Iterator[None]:
    """Hold the exclusive lock of ``model_dir`` (re-entrant within a process).

    Two runs writing one model dir would delete each other's temporary files;
    the second one gets a WriteError naming the first one's pid instead. On a
    storage URI nothing is locked (:class:`tnrec._fileio.DirLock`).
    """
    key = model_dir if _fileio.is_remote(model_dir) else os.path.realpath(model_dir)
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
    with contextlib.ExitStack() as stack:  # releases the lock however the block ends
        failed = np.zeros(1, np.float64)
        error: WriteError | None = None
        if ps.rank == 0:
            try:
                stack.enter_context(hold_lock(model_dir))
            except WriteError as e:
                error, failed[0] = e, 1.0
        if ps.world_size > 1:
            failed = ps.all_reduce_sum(failed)
        if error is not None:
            raise error
        if failed[0] > 0:
            raise WriteError(f"The model dir {model_dir} is in use by another run (see rank 0).")
        yield


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
    check_dt(f(m, "dt", str, fname), fname)
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
            check_dt(resume[key], f"{fname}: resume.{key}")
    if not isinstance(resume.get("day_complete", False), bool):
        raise CheckpointError(f"{fname}: resume.day_complete must be true or false.")


def check_listed_file(path: str, rel: str, digest: str) -> str:
    return check_file(os.path.join(path, rel), digest, "Checkpoint", MANIFEST)
