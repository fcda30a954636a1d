"""LR: logistic regression on hashed features, the baseline of the zoo."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tnrec.feature_column import Column
from tnrec.models.base import ZooModel
from tnrec.optimizer import SparseOptimizer


class LR(ZooModel):
    """Logistic regression: one weight per key (a dimension-1 table) plus ``w . dense + b``.

    Outputs a logit ``[B]``; compile with the default loss
    (``binary_crossentropy_from_logits``).

    Args:
        columns: categorical and numeric feature columns (numeric ones are the
            batch's dense features, in order).
        sparse_optimizer: the key weights' optimizer (default ``AdaGrad(0.05)``).
        dense_optimizer: the dense weights' optimizer (default ``Adam(1e-3)``).
        seed: the table's seed.

    Example:
        >>> import tnrec as tn
        >>> from tnrec.models import LR
        >>> model = LR(tn.data.criteo_columns())
        >>> model.compile()
    """

    zoo_name = "lr"

    def __init__(
        self,
        columns: Sequence[Column],
        sparse_optimizer: SparseOptimizer | None = None,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self._setup(columns, 1, sparse_optimizer, dense_optimizer, deep=False, seed=seed)

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        """Return the logit ``[B]``."""
        return self.linear_logit(pooled, dense)  # [B]
