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


# How a head's output becomes the prediction that metrics, predict and the
# exported Predictor see; recorded by name in exports.
PREDICTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "sigmoid": torch.sigmoid,
}

# name -> (per-sample loss, name of the output -> prediction map)
LOSSES: dict[str, tuple[LossFn, str]] = {
    "binary_crossentropy": (_bce, "identity"),
    "binary_crossentropy_from_logits": (_bce_logits, "sigmoid"),
    "mse": (mse, "identity"),
}


@dataclass
class Head:
    """One output of the model: its label, loss, weight and metrics."""

    name: str
    label: str | None  # resolved against the first batch when None
    loss: LossFn
    prediction: str  # a key of PREDICTIONS
    weight: float
    metrics: list[metrics_lib.Metric]

    def to_prediction(self, output: torch.Tensor) -> torch.Tensor:
        """Map the head's output to its prediction (a probability for BCE on logits)."""
        return PREDICTIONS[self.prediction](output)
