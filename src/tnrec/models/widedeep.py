"""Wide & Deep (Cheng et al., 2016): a linear model plus an MLP over the embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tnrec.feature_column import Column
from tnrec.models.base import ZooModel, mlp
from tnrec.optimizer import SparseOptimizer


class WideDeep(ZooModel):
    """``logit = wide(keys, dense) + MLP([embeddings, dense])``.

    The wide part is one weight per key (a dimension-1 table) plus a linear
    layer over the dense features; the deep part embeds every categorical
    column with ``embedding_dim`` and runs an MLP on the concatenation with the
    dense features. Outputs a logit ``[B]``.

    Args:
        columns: categorical and numeric feature columns.
        embedding_dim: D, the embedding width of every categorical column.
        hidden_units: the MLP's hidden layer widths.
        sparse_optimizer: both tables' optimizer (default ``AdaGrad(0.05)``).
        dense_optimizer: the dense layers' optimizer (default ``Adam(1e-3)``).
        seed: the tables' seed.

    Example:
        >>> import tnrec as tn
        >>> from tnrec.models import WideDeep
        >>> model = WideDeep(tn.data.criteo_columns(), embedding_dim=8,
        ...                hidden_units=[256, 128])
        >>> model.compile()
    """

    zoo_name = "widedeep"

    def __init__(
        self,
        columns: Sequence[Column],
        embedding_dim: int = 16,
        hidden_units: Sequence[int] = (400, 400, 400),
        sparse_optimizer: SparseOptimizer | None = None,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__()
        C, F = self._setup(columns, embedding_dim, sparse_optimizer, dense_optimizer, seed=seed)
        self.deep = mlp(C * embedding_dim + F, hidden_units, "WideDeep", out_features=1)

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        """Return the logit ``[B]``."""
        deep = self.deep(torch.cat([pooled["emb"], dense], dim=1))  # [B, 1]
        return self.linear_logit(pooled, dense) + deep.squeeze(-1)  # [B]
