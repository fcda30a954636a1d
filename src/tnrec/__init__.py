"""tnrec: TensorNet's sparse tables and temporary embedding matrix on PyTorch.

This module only re-exports the public packages; it defines nothing itself.
Subpackages load on first use, so ``import tnrec.table`` (NumPy + numba) never
imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_SUBMODULES = {
    "callbacks",
    "checkpoint",
    "cli",
    "compat",
    "daily",
    "data",
    "distribute",
    "errors",
    "export",
    "feature_column",
    "launch",
    "layers",
    "losses",
    "memory",
    "metrics",
    "model",
    "models",
    "optimizer",
    "ps",
    "runlog",
    "schedules",
    "serve",
    "serving",
    "table",
}

__all__ = ["Model", "__version__", *sorted(_SUBMODULES)]

if TYPE_CHECKING:
    from tnrec import (  # noqa: F401
        callbacks,
        checkpoint,
        cli,
        compat,
        daily,
        data,
        distribute,
        errors,
        export,
        feature_column,
        launch,
        layers,
        losses,
        memory,
        metrics,
        model,
        models,
        optimizer,
        ps,
        runlog,
        schedules,
        serve,
        serving,
        table,
    )
    from tnrec.model import Model


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"tnrec.{name}")
    if name == "Model":
        return importlib.import_module("tnrec.model").Model
    raise AttributeError(f"module 'tnrec' has no attribute {name!r}")
