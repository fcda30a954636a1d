"""DeepFM (Guo et al., 2017): linear + factorization machine + MLP on shared embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tnrec.feature_column import Column
from tnrec.models.base import ZooModel, mlp
from tnrec.optimizer import SparseOptimizer


class DeepFM(ZooModel):
    """``logit = linear + FM(embeddings) + MLP([embeddings, dense])``.

    The FM term is the sum over pairs of categorical columns of the dot product
    of their embeddings, ``0.5 * sum_d((sum_c v_cd)^2 - sum_c v_cd^2)``; the MLP
    reads the same embeddings (and the dense features). The linear part is one
    weight per key (a dimension-1 table) plus a linear layer over the dense
    features. Numeric columns enter the linear part and the MLP, not the FM.
    Outputs a logit ``[B]``.

    Args:
        columns: categorical and numeric feature columns.
        embedding_dim: D, the embedding width of every categorical column.
        hidden_units: the MLP's hidden layer widths.
        sparse_optimizer: both tables' optimizer (default ``AdaGrad(0.05)``).
        dense_optimizer: the dense layers' optimizer (default ``Adam(1e-3)``).
        seed: the tables' seed.

    Example:
        >>> import tnrec as tn
        >>> from tnrec.models import DeepFM
        >>> model = DeepFM(tn.data.criteo_columns(), embedding_dim=16,
        ...              hidden_units=[400, 400, 400])
        >>> model.compile()  # binary_crossentropy_from_logits, Adam(1e-3), auc + logloss
    """

    zoo_name = "deepfm"

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
        self.num_fields = C
        self.deep = mlp(C * embedding_dim + F, hidden_units, "DeepFM", out_features=1)

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        """Return the logit ``[B]``."""
        flat = pooled["emb"]  # [B, C*D]
        v = flat.view(flat.shape[0], self.num_fields, self.embedding_dim)  # [B, C, D]
        fm = 0.5 * (v.sum(dim=1).square() - v.square().sum(dim=1)).sum(dim=1)  # [B]
        deep = self.deep(torch.cat([flat, dense], dim=1)).squeeze(-1)  # [B]
        return self.linear_logit(pooled, dense) + fm + deep  # [B]
