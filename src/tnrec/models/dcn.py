"""DCN-v2 (Wang et al., 2021): full-rank cross layers next to an MLP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tnrec.errors import ArgumentError
from tnrec.feature_column import Column
from tnrec.models.base import ZooModel, mlp
from tnrec.optimizer import SparseOptimizer


class CrossLayer(torch.nn.Module):
    """One DCN-v2 cross layer: ``x_{l+1} = x0 * (W x_l + b) + x_l``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Return ``x0 * (W x + b) + x`` ``[B, d]``."""
        return x0 * self.linear(x) + x  # [B, d]


class DCN(ZooModel):
    """DCN-v2, parallel form: ``logit = w . [cross(x0), MLP(x0)] + b``.

    ``x0 = [embeddings, dense]`` (``d = C*D + F``); ``cross_layers`` full-rank
    cross layers and the MLP both read ``x0``, and one linear layer combines
    their outputs. No wide (dimension-1) table: the first cross layer already
    carries the linear terms. Outputs a logit ``[B]``.

    Args:
        columns: categorical and numeric feature columns.
        embedding_dim: D, the embedding width of every categorical column.
        hidden_units: the MLP's hidden layer widths.
        sparse_optimizer: the table's optimizer (default ``AdaGrad(0.05)``).
        dense_optimizer: the dense layers' optimizer (default ``Adam(1e-3)``).
        cross_layers: the number of cross layers.
        seed: the table's seed.

    Example:
        >>> import tnrec as tn
        >>> from tnrec.models import DCN
        >>> model = DCN(tn.data.criteo_columns(), embedding_dim=16,
        ...           hidden_units=[400, 400], cross_layers=3)
        >>> model.compile()
    """

    zoo_name = "dcn"

    def __init__(
        self,
        columns: Sequence[Column],
        embedding_dim: int = 16,
        hidden_units: Sequence[int] = (400, 400, 400),
        sparse_optimizer: SparseOptimizer | None = None,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None,
        *,
        cross_layers: int = 3,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(cross_layers, bool) or not isinstance(cross_layers, int) or cross_layers < 0:
            raise ArgumentError(
                f"DCN: `cross_layers` must be an int >= 0. Received: cross_layers={cross_layers!r}."
            )
        C, F = self._setup(
            columns, embedding_dim, sparse_optimizer, dense_optimizer, wide=False, seed=seed
        )
        d = C * embedding_dim + F
        self.cross = torch.nn.ModuleList(CrossLayer(d) for _ in range(cross_layers))
        self.deep = mlp(d, hidden_units, "DCN")
        self.out = torch.nn.Linear(d + (list(hidden_units) or [d])[-1], 1)
        torch.nn.init.zeros_(self.out.bias)  # set from the labels by the first training step

    def output_bias(self) -> torch.Tensor:
        """Return the output layer's bias ``[1]`` (the logit's bias)."""
        return self.out.bias

    def forward_dense(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        """Return the logit ``[B]``."""
        x0 = torch.cat([pooled["emb"], dense], dim=1)  # [B, d]
        x = x0
        for layer in self.cross:
            x = layer(x0, x)  # [B, d]
        return self.out(torch.cat([x, self.deep(x0)], dim=1)).squeeze(-1)  # [B]
