"""Loading a checkpoint on any number of workers: validate everything, then apply."""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tnrec import _fileio
from tnrec.checkpoint.layout import DENSE, MANIFEST, check_listed_file, latest, read_manifest
from tnrec.checkpoint.save import owned_buckets
from tnrec.errors import (
    CheckpointError,
    MismatchError,
)
from tnrec.feature_column import canonical_spec
from tnrec.layers.spec import feature_spec, layers_spec
from tnrec.table import files as table_files

if TYPE_CHECKING:
    from tnrec.layers.spec import CheckpointModel as Model
    from tnrec.ps import ParameterServer

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
    mine = owned_buckets(model.ps.rank, model.ps.world_size)
    parts = {name: _parts_to_read(path, saved, mine) for name, saved in plan.items()}
    dense_file, dense = _read_dense(path, manifest)
    state = _dense_plan(model, dense.get("model", {}), partial, report, dense_file)
    rng = _read_worker_state(path, manifest, model.ps, report)
    # everything but the rows is validated (rows are hashed as they stream in; a damaged
    # part restores the previous tables); from here on the model changes
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
    """The parts of one saved table that hold some of this worker's buckets: ``(part
    directory, its checked header)``. The parts' row files are verified as they are read."""
    reads = []
    W = len(saved["parts"])
    for part in saved["parts"]:
        if not (mine & owned_buckets(int(part["rank"]), W)).any():
            continue  # this part holds none of my buckets
        full = check_listed_file(
            path, os.path.join(part["dir"], table_files.HEADER), part["header_sha256"]
        )
        reads.append((os.path.dirname(full), table_files.read_header(os.path.dirname(full))))
    return reads


def _read_dense(path: str, manifest: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check and read ``dense.pt`` (tensors and numbers only: ``weights_only=True``)."""
    dense_file = check_listed_file(path, DENSE, manifest["files"][DENSE])
    try:
        source = (
            io.BytesIO(_fileio.read_bytes(dense_file)) if _fileio.is_remote(path) else dense_file
        )
        dense = torch.load(source, weights_only=True, map_location="cpu")
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
    worker = _read_worker(check_listed_file(path, worker_rel, manifest["files"][worker_rel]))
    report.position = worker.get("position")
    rng = worker.get("torch_rng")
    return rng if isinstance(rng, str) else None


def _apply_tables(
    model: Model,
    parts: dict[str, list[tuple[str, dict[str, Any]]]],
    mine: np.ndarray,
    report: LoadReport,
) -> None:
    """Fresh tables, filled with this worker's buckets of every part.

    A part's files are hashed as they stream in; a damaged one raises after
    its rows went into the fresh tables, so the model gets its previous tables
    back before the error propagates.
    """
    previous = model._ps
    model.build_tables()
    try:
        for name, reads in parts.items():
            table = model.tables[name]
            for part_dir, header in reads:
                table_files.load_into(table, part_dir, buckets=mine, header=header)
            report.loaded.append(f"table {name}")
    except BaseException:
        model._ps = previous
        raise
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
