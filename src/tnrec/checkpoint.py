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
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    FormatVersionError,
    MismatchError,
)
from tnrec.feature_column import to_spec
from tnrec.table import NUM_BUCKETS
from tnrec.table import files as table_files
from tnrec.table.files import check_file, fsync_dir, sha256_file
from tnrec.table.files import kill_point as _kill_point

if TYPE_CHECKING:
    from tnrec.model import Model

FORMAT = "tnrec.checkpoint"
FORMAT_VERSION = 1
POINTER = "_checkpoint"
MANIFEST = "manifest.json"
DENSE = "dense.pt"
_GEN = re.compile(r"^[0-9]+$")


# ---------------------------------------------------------------- small file helpers


def _write_json(path: str, doc: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"Cannot read checkpoint file {path}: {e}.") from None


# ---------------------------------------------------------------- locating checkpoints


def _pointer_generation(model_dir: str) -> int:
    pointer = os.path.join(model_dir, POINTER)
    if not os.path.exists(pointer):
        return 0
    doc = _read_json(pointer)
    if not isinstance(doc, dict) or not isinstance(doc.get("generation"), int):
        raise CheckpointError(f"{pointer} does not name a checkpoint generation.")
    return int(doc["generation"])


def _all_generations(model_dir: str) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    if not os.path.isdir(model_dir):
        return found
    for dt in os.listdir(model_dir):
        day = os.path.join(model_dir, dt)
        if dt.startswith((".", "_")) or not os.path.isdir(day):
            continue
        for g in os.listdir(day):
            if _GEN.match(g) and os.path.isdir(os.path.join(day, g)):
                found.append((dt, int(g)))
    return sorted(found, key=lambda x: x[1])


def generations(model_dir: str) -> list[tuple[str, int]]:
    """Return every published ``(dt, generation)`` in ``model_dir``, oldest first.

    Published means complete and not newer than the generation ``_checkpoint``
    names: a directory renamed into place by a save that was killed before it
    moved ``_checkpoint`` is not published, and the next save replaces it.
    """
    last = _pointer_generation(model_dir)
    return [
        (dt, g)
        for dt, g in _all_generations(model_dir)
        if g <= last and os.path.isfile(os.path.join(model_dir, dt, str(g), MANIFEST))
    ]


def latest(model_dir: str, dt: str | None = None) -> str | None:
    """Return the directory of the last complete checkpoint (of day ``dt`` if given), or None.

    Without ``dt`` this is the directory ``_checkpoint`` names. With ``dt``, the
    newest published generation of that day.

    Raises:
        CheckpointError: ``_checkpoint`` is unreadable or names a missing directory.
    """
    if dt is None:
        pointer = os.path.join(model_dir, POINTER)
        if not os.path.exists(pointer):
            return None
        doc = _read_json(pointer)
        if not isinstance(doc, dict) or "dir" not in doc:
            raise CheckpointError(f"{pointer} does not name a checkpoint directory.")
        path = os.path.join(model_dir, doc["dir"])
        if not os.path.isfile(os.path.join(path, MANIFEST)):
            raise CheckpointError(f"{pointer} names {path}, which has no {MANIFEST}.")
        return path
    gens = [g for d, g in generations(model_dir) if d == dt]
    return os.path.join(model_dir, dt, str(gens[-1])) if gens else None


# ---------------------------------------------------------------- save


def _owned_buckets(rank: int, world: int) -> np.ndarray:
    return np.arange(NUM_BUCKETS) % world == rank


def _rng_state() -> str:
    return base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()


def feature_spec(model: Model) -> dict[str, Any]:
    """Return the feature spec of the model's inputs: its layers' categorical columns, then
    ``model.feature_columns`` (numeric columns and anything else it declares), one per key.

    The layers' embedding settings (dimension, combiner, table) are stored beside it
    in the manifest's ``layers``.
    """
    cols: list[Any] = []
    for layer in model.embedding_layers():
        cols += [c.categorical for c in layer.columns]
    cols += list(getattr(model, "feature_columns", []) or [])
    unique: dict[str, Any] = {}
    for c in cols:
        c = getattr(c, "categorical", c)
        unique.setdefault(c.key, c)
    return to_spec(list(unique.values()))


def layers_spec(model: Model) -> dict[str, Any]:
    """Return each embedding layer's table and columns (key, dimension, combiner)."""
    return {
        layer.name or layer.table_name: {
            "table": layer.table_name,
            "columns": [[c.key, c.dimension, c.combiner] for c in layer.columns],
        }
        for layer in model.embedding_layers()
    }


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
    rank, world = ps.rank, ps.world_size
    gen_vec = np.zeros(1, np.float64)
    if rank == 0:
        os.makedirs(model_dir, exist_ok=True)
        gen_vec[0] = _pointer_generation(model_dir) + 1
    generation = int(ps.all_reduce_sum(gen_vec)[0])
    tmp = os.path.join(model_dir, dt, f".tmp-{generation}")
    if rank == 0:
        for odt, g in _all_generations(model_dir):  # left by a save killed before publishing
            if g >= generation:
                shutil.rmtree(os.path.join(model_dir, odt, str(g)))
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "workers"))
    ps.barrier("checkpoint: create directory")

    for name in sorted(model.tables):
        part = os.path.join(tmp, "sparse", name, f"part-{rank:05d}-of-{world:05d}")
        table_files.save(model.tables[name], part, order="bucket")
        _kill_point(f"after-table:{name}")
    _write_json(
        os.path.join(tmp, "workers", f"rank-{rank}.json"),
        {"rank": rank, "position": position, "torch_rng": _rng_state()},
    )
    _kill_point("after-worker-file")
    if rank == 0:
        dense = {"model": model.state_dict()}
        if model.optimizer is not None:
            dense["optimizer"] = model.optimizer.state_dict()
        with open(os.path.join(tmp, DENSE), "wb") as f:
            torch.save(dense, f)
            f.flush()
            os.fsync(f.fileno())
        _kill_point("after-dense")
    ps.barrier("checkpoint: files written")

    if rank == 0:
        manifest = _manifest(model, tmp, dt, generation, world, resume or {})
        _write_json(os.path.join(tmp, MANIFEST), manifest)
        fsync_dir(tmp)
        final = os.path.join(model_dir, dt, str(generation))
        _kill_point("before-rename")
        os.rename(tmp, final)
        fsync_dir(os.path.join(model_dir, dt))
        _kill_point("after-rename")
        pointer_tmp = os.path.join(model_dir, f".{POINTER}.tmp")
        _write_json(pointer_tmp, {"dt": dt, "dir": f"{dt}/{generation}", "generation": generation})
        _kill_point("before-publish")
        os.replace(pointer_tmp, os.path.join(model_dir, POINTER))
        fsync_dir(model_dir)
        _kill_point("after-publish")
        if keep is not None:
            _prune(model_dir, keep, f"{dt}/{generation}")
    ps.barrier("checkpoint: published")
    for table in model.tables.values():
        table.generation = generation + 1
    return os.path.join(model_dir, dt, str(generation))


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


def _prune(model_dir: str, keep: int, published: str) -> None:
    gens = generations(model_dir)
    for dt, g in gens[: max(len(gens) - keep, 0)]:
        if f"{dt}/{g}" != published:
            shutil.rmtree(os.path.join(model_dir, dt, str(g)), ignore_errors=True)


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
    """Read and check a checkpoint directory's manifest."""
    fname = os.path.join(path, MANIFEST)
    manifest = _read_json(fname)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{fname} is not a tnrec checkpoint manifest.")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatVersionError(
            f"{fname}: format_version {manifest.get('format_version')!r} is not supported "
            f"(this tnrec reads {FORMAT_VERSION})."
        )
    return manifest


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
    ps = model.ps
    rank, world = ps.rank, ps.world_size
    report = LoadReport(path=path, generation=int(manifest["generation"]))
    # ---- validate: manifest vs model, then every file this worker reads
    fname = os.path.join(path, MANIFEST)
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
        manifest.get("feature_spec") != feature_spec(model)
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
    parts_to_read: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    mine = _owned_buckets(rank, world)
    for name, saved in plan.items():
        reads = []
        W = len(saved["parts"])
        for part in saved["parts"]:
            if not (mine & _owned_buckets(int(part["rank"]), W)).any():
                continue  # this part holds none of my buckets
            full = _check_file(
                path, os.path.join(part["dir"], table_files.HEADER), part["header_sha256"]
            )
            reads.append((os.path.dirname(full), table_files.verify(os.path.dirname(full))))
        parts_to_read[name] = reads
    dense_file = _check_file(path, DENSE, manifest["files"][DENSE])
    try:
        dense = torch.load(dense_file, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises several types for a bad file
        raise CheckpointError(f"Cannot read {dense_file}: {e}.") from None
    state = _dense_plan(model, dense.get("model", {}), partial, report, dense_file)
    rng = None
    worker_rel = os.path.join("workers", f"rank-{rank}.json")
    if int(manifest["world_size"]) == world and worker_rel in manifest["files"]:
        worker = _read_json(_check_file(path, worker_rel, manifest["files"][worker_rel]))
        report.position = worker.get("position")
        rng = worker.get("torch_rng")
    # ---- apply: fresh tables, this worker's buckets of every part, dense state
    model.build_tables()
    for name, reads in parts_to_read.items():
        table = model.tables[name]
        for part_dir, header in reads:
            table_files.load_into(table, part_dir, buckets=mine, verified=header)
        report.loaded.append(f"table {name}")
    for table in model.tables.values():
        table.generation = report.generation + 1
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
    ps.broadcast_parameters([*model.parameters(), *model.buffers()])
    if rng is not None:  # dropout and other torch randomness continue as if never stopped
        rng_bytes = np.frombuffer(base64.b64decode(rng), dtype=np.uint8).copy()
        torch.set_rng_state(torch.from_numpy(rng_bytes))
    report.resume = dict(manifest.get("resume") or {})
    return report


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
