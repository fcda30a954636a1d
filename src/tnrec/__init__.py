"""tnrec: TensorNet's sparse tables and temporary embedding matrix on PyTorch.

This module only re-exports the public packages; it defines nothing itself.
"""

from tnrec import (
    callbacks,
    data,
    errors,
    feature_column,
    layers,
    metrics,
    optimizer,
    ps,
    table,
)
from tnrec.model import Model

__version__ = "0.1.0"

__all__ = [
    "Model",
    "__version__",
    "callbacks",
    "data",
    "errors",
    "feature_column",
    "layers",
    "metrics",
    "optimizer",
    "ps",
    "table",
]
