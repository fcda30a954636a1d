"""Losses by name and the model's heads (one per output)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tnrec import metrics as metrics_lib

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SINGLE = ""  # the head name of a model with one output


def _bce(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy(pred, y, reduction="none")


def _bce_logits(logit: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logit, y, reduction="none")


def mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (pred - y) ** 2


# name -> (per-sample loss, output -> prediction used by metrics and predict)
LOSSES: dict[str, tuple[LossFn, Callable[[torch.Tensor], torch.Tensor]]] = {
    "binary_crossentropy": (_bce, lambda x: x),
    "binary_crossentropy_from_logits": (_bce_logits, torch.sigmoid),
    "mse": (mse, lambda x: x),
}


@dataclass
class Head:
    """One output of the model: its label, loss, weight and metrics."""

    name: str
    label: str | None  # resolved against the first batch when None
    loss: LossFn
    to_prediction: Callable[[torch.Tensor], torch.Tensor]
    weight: float
    metrics: list[metrics_lib.Metric]
