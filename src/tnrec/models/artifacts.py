"""Minimal saved models for the CLI: until checkpoints exist, what ``tnrec train`` writes.

This module is the one place that writes and reads them, so the checkpoint
format (``model.save_weights``) can replace it. Layout::

    model_dir/
      model.json          # format, version, zoo name, constructor params, optimizer configs,
                          # table names
      feature_spec.json   # tnrec.feature_column.to_spec(model.columns)
      dense.pt            # torch.save(model.state_dict()); read with weights_only=True
      tables/<name>/      # SparseTable.save(...) of every table (.npy + table.json)

No pickle is read back: ``dense.pt`` is loaded with ``torch.load(...,
weights_only=True)`` and tables are ``.npy`` + JSON. The dense optimizer's
state is not saved (evaluate and predict do not need it).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

from tnrec.errors import CheckpointError, FormatVersionError, MismatchError
from tnrec.feature_column import from_spec, to_spec
from tnrec.models import MODELS, ZooModel
from tnrec.optimizer import SparseOptimizer
from tnrec.table import optimizer_from_config

FORMAT = "tnrec.zoo_model"
VERSION = 1

__all__ = ["FORMAT", "VERSION", "load_model", "save_model"]


def save_model(model: ZooModel, path: str | os.PathLike[str], params: dict[str, Any]) -> None:
    """Write ``model`` (tables, dense weights, spec, how to rebuild it) to directory ``path``.

    The directory is written beside ``path`` and renamed into place, replacing
    an earlier one, so a crash leaves the previous version or none.

    Args:
        model: a trained zoo model.
        path: the directory to (re)create.
        params: the constructor arguments besides columns and optimizers
            (``embedding_dim``, ``hidden_units``, ...), JSON-ready.

    Raises:
        CheckpointError: a file cannot be written (names it).
    """
    if not model.zoo_name:
        raise CheckpointError(f"save_model: {type(model).__name__} is not a zoo model.")
    dest = os.fspath(path)
    tmp = f"{dest}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    layer = next(iter(model.embedding_layers()))
    dense_opt = model.default_dense_optimizer
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.zoo_name,
        "params": params,
        "sparse_optimizer": layer.sparse_optimizer.to_config(),
        "dense_optimizer": dense_opt.to_config()
        if isinstance(dense_opt, SparseOptimizer)
        else None,
        "tables": sorted(model.tables),
    }
    try:
        os.makedirs(tmp)
        with open(os.path.join(tmp, "model.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
        with open(os.path.join(tmp, "feature_spec.json"), "w", encoding="utf-8") as f:
            json.dump(to_spec(model.columns), f, indent=2)
        torch.save(model.state_dict(), os.path.join(tmp, "dense.pt"))
        for name, table in model.tables.items():
            table.save(os.path.join(tmp, "tables", name))
        old = f"{dest}.old-{os.getpid()}"
        if os.path.exists(dest):
            os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"save_model: cannot write {dest}: {e}") from e


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} not found: not a model directory written by `tnrec train`."
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from e


def load_model(path: str | os.PathLike[str]) -> tuple[ZooModel, dict[str, Any]]:
    """Rebuild a model saved by :func:`save_model`, compiled with its default loss and metrics.

    Returns:
        The model (in eval mode) and the ``model.json`` document.

    Raises:
        CheckpointError: a file is missing or unreadable (named);
            FormatVersionError / MismatchError for the specific faults.
    """
    root = os.fspath(path)
    doc = _read_json(os.path.join(root, "model.json"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{root}/model.json: not a {FORMAT} document.")
    if doc.get("version") != VERSION:
        raise FormatVersionError(
            f"{root}/model.json: version {doc.get('version')!r}; this tnrec reads {VERSION}."
        )
    if doc.get("model") not in MODELS:
        raise CheckpointError(f"{root}/model.json: unknown model {doc.get('model')!r}.")
    columns = from_spec(_read_json(os.path.join(root, "feature_spec.json")))
    sparse = optimizer_from_config(doc["sparse_optimizer"])
    dense = optimizer_from_config(doc["dense_optimizer"]) if doc["dense_optimizer"] else None
    model = MODELS[doc["model"]](
        columns, sparse_optimizer=sparse, dense_optimizer=dense, **doc["params"]
    )
    model.compile()
    if sorted(model.tables) != sorted(doc["tables"]):
        raise MismatchError(
            f"{root}/model.json: saved tables {doc['tables']} != the model's "
            f"{sorted(model.tables)}."
        )
    for name, table in model.tables.items():
        table.load_rows(os.path.join(root, "tables", name))
    dense_path = os.path.join(root, "dense.pt")
    try:
        state = torch.load(dense_path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{dense_path} not found.") from None
    except Exception as e:  # torch raises several types for a corrupt or unsafe file
        raise CheckpointError(f"{dense_path}: cannot read the dense weights: {e}") from e
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise MismatchError(f"{dense_path}: does not match the model: {e}") from e
    model.eval()
    return model, doc
