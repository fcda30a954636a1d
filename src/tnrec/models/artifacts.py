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
only. No pickle is read back anywhere: the checkpoint's dense file is read with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tnrec.errors import CheckpointError, FormatVersionError, MismatchError
from tnrec.feature_column import from_spec, to_spec
from tnrec.models import MODELS, ZooModel
from tnrec.optimizer import SparseOptimizer
from tnrec.table import EvictionPolicy, optimizer_from_config

FORMAT = "tnrec.zoo_model"
VERSION = 2
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
        "version": VERSION,
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
    """Write ``doc`` to ``model_dir/model.json`` atomically; return the path. Call on rank 0 only.

    Raises:
        CheckpointError: the file cannot be written (names it).
    """
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, MODEL_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise CheckpointError(f"Cannot write {path}: {e}") from e
    return path


def read_model_json(model_dir: str) -> dict[str, Any]:
    """Read and check ``model_dir/model.json``.

    Raises:
        CheckpointError: missing or unreadable (named); FormatVersionError for
            another version.
    """
    path = os.path.join(model_dir, MODEL_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} not found: not a model directory written by `tnrec train`."
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} document.")
    if doc.get("version") != VERSION:
        raise FormatVersionError(
            f"{path}: version {doc.get('version')!r}; this tnrec reads {VERSION}."
        )
    if doc.get("model") not in MODELS:
        raise CheckpointError(f"{path}: unknown model {doc.get('model')!r}.")
    return doc


def build_model_from_doc(doc: dict[str, Any], where: str = MODEL_FILE) -> ZooModel:
    """Build (and compile) the zoo model a ``model.json`` document describes; no weights.

    Build it after creating a :class:`~tnrec.distribute.PsStrategy` to shard its tables.

    Raises:
        MismatchError: the document's tables differ from the model's.
    """
    columns = from_spec(doc["feature_spec"])
    sparse = optimizer_from_config(doc["sparse_optimizer"])
    dense = optimizer_from_config(doc["dense_optimizer"]) if doc["dense_optimizer"] else None
    model = MODELS[doc["model"]](
        columns, sparse_optimizer=sparse, dense_optimizer=dense, **doc["params"]
    )
    if doc.get("policy") is not None:
        policy = EvictionPolicy.from_config(doc["policy"])
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
