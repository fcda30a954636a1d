"""How a zoo model is rebuilt from its model dir: ``model.json`` beside the checkpoints.

A model dir written by ``tnrec train`` is a checkpoint root
(:mod:`tnrec.checkpoint`: weights, dense optimizer state, tables, resume
state) plus one small file that says which zoo model to build::

    model_dir/
      model.json          # format, version, zoo name, constructor params, optimizer configs,
                          # eviction policy, table names, feature spec, the run config
      _checkpoint         # tnrec.checkpoint
      <dt>/<generation>/  # tnrec.checkpoint

``model.json`` is written atomically (temporary file, fsync, rename) by rank 0
only, with a checksum of its content (:mod:`tnrec._fileio`). No pickle is read
back anywhere: the checkpoint's dense file is read with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import os
from typing import Any

from tnrec import _fileio
from tnrec.errors import CheckpointError, MismatchError, TnrecError
from tnrec.feature_column import from_spec, to_spec
from tnrec.models import MODELS, ZooModel
from tnrec.optimizer import SparseOptimizer
from tnrec.table import EvictionPolicy, optimizer_from_config

FORMAT = "tnrec.zoo_model"
VERSION = 3
MODEL_FILE = "model.json"

__all__ = [
    "FORMAT",
    "MODEL_FILE",
    "VERSION",
    "build_model_from_doc",
    "load_model",
    "model_doc",
    "read_model_json",
    "save_model",
    "write_model_json",
]


def model_doc(
    model: ZooModel,
    params: dict[str, Any],
    policy: EvictionPolicy | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the ``model.json`` document of ``model``.

    Args:
        model: a zoo model.
        params: the constructor arguments besides columns and optimizers
            (``embedding_dim``, ``hidden_units``, ``seed``, ...), JSON-ready.
        policy: the tables' eviction policy (None: the default, which deletes nothing).
        config: the resolved run config (``RunConfig.to_dict()``), so that
            ``evaluate``/``predict`` can read data the way training did.

    Raises:
        CheckpointError: ``model`` is not a zoo model.
    """
    if not getattr(model, "zoo_name", ""):
        raise CheckpointError(f"model.json: {type(model).__name__} is not a zoo model.")
    layer = next(iter(model.embedding_layers()))
    dense_opt = model.default_dense_optimizer
    return {
        "format": FORMAT,
        "format_version": VERSION,
        "model": model.zoo_name,
        "params": params,
        "sparse_optimizer": layer.sparse_optimizer.to_config(),
        "dense_optimizer": dense_opt.to_config()
        if isinstance(dense_opt, SparseOptimizer)
        else None,
        "policy": policy.to_config() if policy is not None else None,
        "tables": sorted({la.table_name for la in model.embedding_layers()}),
        "feature_spec": to_spec(model.columns),
        "config": config,
    }


def write_model_json(model_dir: str, doc: dict[str, Any]) -> str:
    """Write ``doc`` to ``model_dir/model.json`` atomically, with its checksum; return the path.
    Call on rank 0 only.

    Raises:
        WriteError: the file cannot be written (names it).
    """
    _fileio.makedirs(model_dir)
    path = os.path.join(model_dir, MODEL_FILE)
    _fileio.write_json(path, doc)
    return path


def _legacy(doc: dict[str, Any]) -> bool:
    """``model.json`` of version 2 spelled its version ``version`` and had no checksum."""
    return doc.get("format") == FORMAT and doc.get("version") == 2 and "format_version" not in doc


def read_model_json(model_dir: str) -> dict[str, Any]:
    """Read and check ``model_dir/model.json``: checksum, then every field the rebuild uses.

    Raises:
        CheckpointError: missing, unreadable, damaged (ChecksumError), a field of the
            wrong type (named); FormatVersionError for another version.
    """
    path = os.path.join(model_dir, MODEL_FILE)
    if not _fileio.is_file(path):
        raise CheckpointError(f"{path} not found: not a model directory written by `tnrec train`.")
    doc = _fileio.read_versioned_json(path, FORMAT, VERSION, what="model file", legacy=_legacy)
    f = _fileio.field
    if f(doc, "model", str, path) not in MODELS:
        raise CheckpointError(f"{path}: unknown model {doc.get('model')!r}.")
    for name in ("params", "sparse_optimizer", "feature_spec"):
        f(doc, name, dict, path)
    for name in ("dense_optimizer", "policy", "config"):
        if doc.get(name) is not None:
            f(doc, name, dict, path)
    tables = f(doc, "tables", list, path)
    if not all(isinstance(t, str) for t in tables):
        raise CheckpointError(f"{path}: field 'tables' must be a list of names.")
    return doc


def build_model_from_doc(doc: dict[str, Any], where: str = MODEL_FILE) -> ZooModel:
    """Build (and compile) the zoo model a ``model.json`` document describes; no weights.

    Build it after creating a :class:`~tnrec.distribute.PsStrategy` to shard its tables.

    Raises:
        MismatchError: the document's tables differ from the model's.
    """
    try:
        columns = from_spec(doc["feature_spec"])
        sparse = optimizer_from_config(doc["sparse_optimizer"])
        dense_cfg = doc.get("dense_optimizer")
        dense = optimizer_from_config(dense_cfg) if dense_cfg else None
        model = MODELS[doc["model"]](
            columns, sparse_optimizer=sparse, dense_optimizer=dense, **doc["params"]
        )
        policy = EvictionPolicy.from_config(doc["policy"]) if doc.get("policy") else None
    except (TnrecError, TypeError, KeyError, ValueError) as e:
        raise CheckpointError(f"{where}: cannot rebuild the model it describes: {e}") from None
    if policy is not None:
        for layer in model.embedding_layers():
            layer.policy = policy
    tables = sorted({la.table_name for la in model.embedding_layers()})
    if tables != sorted(doc["tables"]):
        raise MismatchError(f"{where}: saved tables {doc['tables']} != the model's {tables}.")
    model.compile()
    return model


def save_model(
    model: ZooModel,
    path: str | os.PathLike[str],
    params: dict[str, Any],
    dt: str = "model",
    policy: EvictionPolicy | None = None,
) -> str:
    """Write ``model.json`` and a checkpoint of day ``dt`` to ``path``; return the checkpoint dir.

    Every worker calls it (the checkpoint has barriers); rank 0 writes ``model.json``.
    """
    model_dir = os.fspath(path)
    if model.ps.rank == 0:
        write_model_json(model_dir, model_doc(model, params, policy))
    return model.save_weights(model_dir, dt)


def load_model(
    path: str | os.PathLike[str], dt: str | None = None
) -> tuple[ZooModel, dict[str, Any]]:
    """Rebuild the zoo model of a model dir and load its last complete checkpoint (of ``dt``).

    Returns:
        The model (compiled, in eval mode) and the ``model.json`` document.

    Raises:
        CheckpointError: ``model.json`` is missing or unreadable, or the dir
            holds no checkpoint (of ``dt``); the checkpoint's own errors
            (ChecksumError, MismatchError, ...) as :func:`tnrec.checkpoint.load`.
    """
    model_dir = os.fspath(path)
    doc = read_model_json(model_dir)
    model = build_model_from_doc(doc, os.path.join(model_dir, MODEL_FILE))
    from tnrec import checkpoint

    if checkpoint.latest(model_dir, dt) is None:
        what = f"of day {dt!r} " if dt is not None else ""
        raise CheckpointError(f"{model_dir} holds no complete checkpoint {what}to load.")
    model.load_weights(model_dir, dt)
    model.eval()
    return model, doc
