"""What the zoo models share: splitting columns, the MLP, the logit convention, configs.

Every zoo model outputs a **logit** ``[B]``; :meth:`ZooModel.compile` defaults
to ``loss="binary_crossentropy_from_logits"``, so metrics and ``predict`` see
probabilities (the sigmoid of the logit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tnrec import metrics as metrics_lib
from tnrec._numeric import dot
from tnrec.errors import ArgumentError
from tnrec.feature_column import (
    BucketizedColumn,
    CategoryColumn,
    Column,
    EmbeddingColumn,
    NumericColumn,
    SequenceCategoryColumn,
    embedding_column,
)
from tnrec.layers import EmbeddingFeatures
from tnrec.losses import LossFn
from tnrec.model import Model
from tnrec.optimizer import AdaGrad, Adam, SparseOptimizer
from tnrec.table import Initializer, normal, zeros

DEFAULT_SPARSE_LR = 0.05
DEFAULT_DENSE_LR = 1e-3
#: The prior's weight in :func:`initial_bias`, in rows: half a click and half a non-click.
BIAS_PSEUDO_ROWS = 1.0
#: The bound of the initial bias: logits in [-5, 5] are rates in [0.0067, 0.9933].
MAX_INITIAL_BIAS = 5.0


def split_columns(
    where: str, columns: Sequence[Column], embedding_dim: int
) -> tuple[list[EmbeddingColumn], list[NumericColumn]]:
    """Return the categorical columns as ``embedding_dim`` embedding columns, and the numeric ones.

    Categorical columns (category, bucketized, or embedding columns of the same
    dimension) go to the embedding layers in order; numeric columns are the
    dense features ``[B, F]`` of the batch, in order.

    Raises:
        ArgumentError: a sequence column, an embedding column of another
            dimension, a non-column, no categorical column, or a bad ``embedding_dim``.
    """
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim <= 0:
        raise ArgumentError(
            f"{where}: `embedding_dim` must be a positive int. Received: {embedding_dim!r}."
        )
    cats: list[EmbeddingColumn] = []
    nums: list[NumericColumn] = []
    for col in columns:
        if isinstance(col, NumericColumn):
            nums.append(col)
        elif isinstance(col, (CategoryColumn, BucketizedColumn)):
            cats.append(embedding_column(col, embedding_dim))
        elif isinstance(col, EmbeddingColumn) and not isinstance(
            col.categorical, SequenceCategoryColumn
        ):
            if col.dimension != embedding_dim:
                raise ArgumentError(
                    f'{where}: column "{col.key}" has dimension {col.dimension}, but the model '
                    f"embeds every column with embedding_dim={embedding_dim}."
                )
            cats.append(col)
        else:
            raise ArgumentError(
                f"{where}: `columns` takes category, bucketized, embedding (pooled) and numeric "
                f"columns. Received: {col!r}."
            )
    if not cats:
        raise ArgumentError(f"{where}: `columns` needs at least one categorical column.")
    return cats, nums


def initial_bias(clicks: float, weight: float, weight_sq: float) -> float:
    """Return the zoo models' initial logit bias from a batch's label sums.

    The bias is the log-odds of the weighted mean label, shrunk toward 1/2 by
    :data:`BIAS_PSEUDO_ROWS` rows (Jeffreys' prior) and bounded to
    ``[-MAX_INITIAL_BIAS, MAX_INITIAL_BIAS]``::

        n = weight**2 / weight_sq                       # effective rows (Kish); B without weights
        p = (clicks / weight * n + 0.5 * a) / (n + a)   # a = BIAS_PSEUDO_ROWS
        bias = clip(log(p / (1 - p)), -5, 5)

    A batch of one class gives a finite, moderate start (7 rows of 0:
    ``log(0.5 / 7.5) = -2.71``; 1,000 rows of 0: -5, the bound) instead of the
    log-odds of a clipped 0 or 1; a realistic batch keeps its rate (1,024 rows
    with 31 clicks: -3.45 against -3.47 unshrunk). Scaling every weight by the
    same factor does not change it.

    Args:
        clicks: ``sum(w * y)`` over the batch's rows (labels in [0, 1]).
        weight: ``sum(w)``, > 0.
        weight_sq: ``sum(w ** 2)``, > 0.

    Returns:
        The initial bias, in ``[-MAX_INITIAL_BIAS, MAX_INITIAL_BIAS]``.
    """
    rate = min(max(clicks / weight, 0.0), 1.0)
    n = weight * weight / weight_sq
    p = (rate * n + 0.5 * BIAS_PSEUDO_ROWS) / (n + BIAS_PSEUDO_ROWS)
    return min(max(math.log(p / (1.0 - p)), -MAX_INITIAL_BIAS), MAX_INITIAL_BIAS)


def wide_columns(cats: Sequence[EmbeddingColumn]) -> list[EmbeddingColumn]:
    """Return the same columns with dimension 1 (the linear / wide part's weights)."""
    return [embedding_column(c.categorical, 1, c.combiner) for c in cats]


def mlp(
    in_features: int, hidden_units: Sequence[int], where: str, out_features: int | None = None
) -> torch.nn.Sequential:
    """Return ``Linear -> ReLU`` per hidden layer, then ``Linear(.., out_features)`` if given.

    Raises:
        ArgumentError: ``hidden_units`` is not a sequence of positive ints.
    """
    units = list(hidden_units) if isinstance(hidden_units, Sequence) else None
    if units is None or not all(
        isinstance(u, int) and not isinstance(u, bool) and u > 0 for u in units
    ):
        raise ArgumentError(
            f"{where}: `hidden_units` must be a list of positive ints. Received: {hidden_units!r}."
        )
    layers: list[torch.nn.Module] = []
    for u in units:
        layers += [torch.nn.Linear(in_features, u), torch.nn.ReLU()]
        in_features = u
    if out_features is not None:
        layers.append(torch.nn.Linear(in_features, out_features))
    return torch.nn.Sequential(*layers)


class ZooModel(Model):
    """Base of the zoo: the embedding layers, the default optimizers and the logit convention.

    Subclasses call :meth:`_setup` and define ``forward_dense`` returning a logit ``[B]``.
    """

    #: the name under which the CLI and :mod:`tnrec.cli.artifacts` know the model
    zoo_name = ""

    def _setup(
        self,
        columns: Sequence[Column],
        embedding_dim: int,
        sparse_optimizer: SparseOptimizer | None,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None,
        *,
        deep: bool = True,
        wide: bool = True,
        initializer: Initializer | None = None,
        seed: int = 0,
    ) -> tuple[int, int]:
        """Build ``self.emb`` (dim ``embedding_dim``) and ``self.wide`` (dim 1) layers.

        Returns:
            ``(C, F)``: the number of categorical and of numeric columns.
        """
        where = type(self).__name__
        cats, nums = split_columns(where, columns, embedding_dim)
        sparse = sparse_optimizer if sparse_optimizer is not None else AdaGrad(DEFAULT_SPARSE_LR)
        self.columns: list[Column] = list(columns)
        self.embedding_dim = embedding_dim
        self.num_dense = len(nums)
        # Declared for the checkpoint's and the export's feature spec: the numeric
        # columns are the dense features [B, F] the Predictor must build.
        self.feature_columns: list[Column] = list(nums)
        if deep:
            # Small initial vectors: FM and cross terms multiply embeddings, and
            # TensorNet's N(0, 1/sqrt(D)) makes their sums over 26 fields explode.
            init = initializer if initializer is not None else normal(0.1)
            self.emb = EmbeddingFeatures(cats, sparse, output="concat", initializer=init, seed=seed)
        if wide:
            # Linear weights start at 0: the first logit is the bias alone.
            self.wide = EmbeddingFeatures(
                wide_columns(cats), sparse, output="concat", initializer=zeros(), seed=seed
            )
            self.bias = torch.nn.Parameter(torch.zeros(1))
            # (no Linear(0, 1) without dense features: torch warns on empty weights)
            self.wide_dense = torch.nn.Linear(self.num_dense, 1, bias=False) if nums else None
        self.default_dense_optimizer = (
            dense_optimizer if dense_optimizer is not None else Adam(DEFAULT_DENSE_LR)
        )
        self._bias_pending = True
        return len(cats), len(nums)

    def output_bias(self) -> torch.Tensor | None:
        """Return the logit's bias parameter ``[1]`` (set by the first training step)."""
        return self.bias if hasattr(self, "bias") else None

    def train_step(self, batch: Any) -> dict[str, float]:
        """As :meth:`tnrec.Model.train_step`; the first step of a new model sets the bias.

        Without a start near the base rate the bias moves only about ``lr`` per
        step under Adam, and the key weights absorb the base rate instead:
        frequent keys learn a large negative offset that rare and new keys lack,
        which costs about 0.04 test AUC on the synthetic data (docs/models_cli.md).
        See :func:`initial_bias` for the value; the bias is left alone when it is
        not 0 (loaded weights) or the loss is not on logits.
        """
        if self._bias_pending and self.training and not self.ps.asynchronous:
            self._init_bias(batch)
        return super().train_step(batch)

    def _before_async_epoch(self, first: Any) -> None:
        """In async mode the bias comes from every worker's first batch of the epoch."""
        if self._bias_pending:
            self._init_bias(first)

    def _init_bias(self, batch: Any) -> None:
        """Set the bias from the global batch's labels (all workers take part; ``batch`` None:
        this worker has no rows)."""
        bias = self.output_bias()
        head = self._heads[0] if len(self._heads) == 1 else None
        if (
            bias is None
            or head is None
            or head.prediction != "sigmoid"
            or bool(bias.detach().any())
        ):
            self._bias_pending = False
            return
        # the labels' checks (all workers raise together) come before they are read
        self._global_size(batch, f"{type(self).__name__}.train_step (step {self.global_step + 1})")
        has_rows = batch is not None and batch.size > 0
        y = self._label(head, batch).astype(np.float64) if has_rows else np.zeros(0)  # [B]
        w = (
            batch.weights.astype(np.float64)
            if has_rows and batch.weights is not None
            else np.ones_like(y)
        )
        # sums over every worker's rows: W workers start from the bias one worker would
        tot = self.ps.all_reduce_sum(np.array([dot(w, y), w.sum(), dot(w, w)]))
        if tot[1] > 0:  # else (no rows, or zero weights) try again on the next step
            self._bias_pending = False
            with torch.no_grad():
                bias.fill_(initial_bias(tot[0], tot[1], tot[2]))

    def linear_logit(self, pooled: dict[str, Any], dense: torch.Tensor) -> torch.Tensor:
        """Return the wide part: ``sum of the keys' weights + w . dense + b`` ``[B]``."""
        logit = pooled["wide"].sum(dim=1) + self.bias  # [B]
        if self.wide_dense is not None:
            logit = logit + self.wide_dense(dense).squeeze(-1)  # [B]
        return logit

    def compile(
        self,
        dense_optimizer: SparseOptimizer | torch.optim.Optimizer | None = None,
        loss: str | LossFn | Mapping[str, str | LossFn] = "binary_crossentropy_from_logits",
        metrics: Sequence[str | metrics_lib.Metric] | Mapping[str, Sequence[Any]] = (
            "auc",
            "logloss",
        ),
        **kwargs: Any,
    ) -> None:
        """Configure training; as :meth:`tnrec.Model.compile` with defaults for a logit model.

        The default loss is ``binary_crossentropy_from_logits`` (zoo models output
        logits), the default metrics ``auc`` and ``logloss``, and the default dense
        optimizer the one given to the constructor.
        """
        super().compile(dense_optimizer, loss, metrics, **kwargs)
