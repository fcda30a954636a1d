"""TensorNet's constructors and defaults, building the tnrec objects that behave the same.

A TensorNet sparse optimizer carries more than the update rule: the initial
scale of new rows, the show decay rate and the eviction rule ride on it.
:func:`AdaGrad`, :func:`Adam` and :func:`Ftrl` take TensorNet's keyword
arguments with TensorNet's defaults and return a :class:`SparseSettings`
holding the three tnrec objects they mean (optimizer, initializer, eviction
policy); :func:`EmbeddingFeatures` takes TensorNet's layer arguments and one
of those. Unknown keyword arguments are refused (TensorNet ignores them).

What each maps to (``docs/tensornet.md`` gives the reasons):

* ``AdaGrad(learning_rate, initial_g2sum, epsilon)`` -- the same row-wise rule.
* ``Adam`` -- ``tn.optimizer.Adam(bias_correction=False)``, TensorNet's rule.
* ``Ftrl(learning_rate=lr)`` -- ``tn.optimizer.Ftrl(learning_rate=1/lr)``:
  TensorNet's ``lr`` multiplies where McMahan's ``alpha`` divides.
* ``initial_scale`` -- ``tn.table.normal(initial_scale)``: ``N(0, 1/sqrt(D))``
  times the scale, as TensorNet draws (tnrec's draw is a pure function of the
  key; TensorNet's is seeded by the clock).
* ``show_decay_rate``, ``show_threshold``, ``no_show_days``,
  ``elimination_logic`` -- ``tn.table.EvictionPolicy``: decay rate as given;
  ``show_threshold=0`` (TensorNet's default, which deletes nothing since no
  show is negative) is no show test; ``no_show_days`` is ``max_unseen_days``;
  ``elimination_logic`` 0 (OR) is ``combine="any"``, 1 (AND) ``"all"``.
  TensorNet's Adam never deletes a row; :func:`Adam` takes no eviction
  arguments. TensorNet's FTRL never counts show, so any ``show_threshold > 0``
  deletes every row at its save; tnrec counts show for every optimizer, so
  here the threshold deletes rows shown less than it.
* ``category_column(key, bucket_size)`` -- ``category_column(key,
  dtype="sign")``: TensorNet's inputs are 64-bit signs, used as keys as they
  are. ``bucket_size`` bounded TensorNet's temporary matrix; tnrec's has no
  bound, so the argument is checked and not used.
* ``embedding_column(..., combiner="mean")`` -- TF's default combiner, where
  tnrec's own default is ``"sum"``.
* ``TNBatchNormalization`` / ``PCTRDNNBatchNormalization`` --
  ``tn.layers.BatchNormalization`` / ``PCTRBatchNormalization`` with
  TensorNet's ``synchronized=False`` (tnrec's layers default to ``True``).
  Keras infers the width from the input; here it is the first argument.

Example:
    >>> import tnrec.compat.tensornet as tnc
    >>> s = tnc.AdaGrad(learning_rate=0.01, initial_g2sum=0.1, initial_scale=0.1)
    >>> s.optimizer
    AdaGrad(learning_rate=0.01, initial_g2sum=0.1, epsilon=1e-08)
    >>> s.policy.max_unseen_days, s.policy.show_threshold
    (1000, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tnrec import feature_column as fc
from tnrec.errors import ArgumentError
from tnrec.layers import BatchNormalization, PCTRBatchNormalization
from tnrec.layers import EmbeddingFeatures as _EmbeddingFeatures
from tnrec.table import AdaGrad as _AdaGrad
from tnrec.table import Adam as _Adam
from tnrec.table import EvictionPolicy, Initializer, SparseOptimizer, normal
from tnrec.table import Ftrl as _Ftrl

__all__ = [
    "AdaGrad",
    "Adam",
    "EmbeddingFeatures",
    "Ftrl",
    "PCTRDNNBatchNormalization",
    "SparseSettings",
    "TNBatchNormalization",
    "category_column",
    "embedding_column",
]


@dataclass(frozen=True)
class SparseSettings:
    """What a TensorNet sparse optimizer stands for in tnrec.

    Attributes:
        optimizer: the update rule, given to the layer as ``sparse_optimizer``.
        initializer: the first vector of a new key.
        policy: show decay and eviction.
    """

    optimizer: SparseOptimizer
    initializer: Initializer
    policy: EvictionPolicy


def _policy(
    where: str,
    show_decay_rate: float,
    show_threshold: float,
    no_show_days: int | None,
    elimination_logic: int,
) -> EvictionPolicy:
    if elimination_logic not in (0, 1) or isinstance(elimination_logic, bool):
        raise ArgumentError(
            f"{where}: `elimination_logic` must be 0 (either test deletes) or 1 (both must). "
            f"Received: elimination_logic={elimination_logic!r}."
        )
    _number(where, "show_threshold", show_threshold)
    return EvictionPolicy(
        show_decay_rate=show_decay_rate,
        show_threshold=float(show_threshold) if show_threshold > 0 else None,
        max_unseen_days=no_show_days,
        combine="any" if elimination_logic == 0 else "all",
    )


def _number(where: str, name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ArgumentError(f"{where}: `{name}` must be a number. Received: {name}={value!r}.")


def _scale(where: str, initial_scale: float) -> Initializer:
    _number(where, "initial_scale", initial_scale)
    return normal(float(initial_scale))


def AdaGrad(  # noqa: N802 -- TensorNet's name
    learning_rate: float = 0.01,
    show_decay_rate: float = 0.98,
    show_threshold: float = 0.0,
    initial_g2sum: float = 0.0,
    initial_scale: float = 1.0,
    epsilon: float = 1e-8,
    grad_decay_rate: float = 1.0,
    mom_decay_rate: float = 1.0,
    no_show_days: int = 1000,
    elimination_logic: int = 0,
) -> SparseSettings:
    """Return TensorNet's ``tensornet.core.AdaGrad(...)`` with its defaults, as tnrec settings.

    ``grad_decay_rate`` and ``mom_decay_rate`` act only in TensorNet's dense
    AdaGrad; its sparse rule never reads them, so a value other than 1.0 is
    refused rather than ignored.

    Raises:
        ArgumentError: a value out of range, or a decay rate other than 1.0.
    """
    for name, value in (("grad_decay_rate", grad_decay_rate), ("mom_decay_rate", mom_decay_rate)):
        if value != 1.0:
            raise ArgumentError(
                f"tensornet.AdaGrad: `{name}` has no effect on TensorNet's sparse AdaGrad "
                f"(only its dense one); leave it at 1.0. Received: {name}={value!r}."
            )
    return SparseSettings(
        _AdaGrad(learning_rate=learning_rate, initial_g2sum=initial_g2sum, epsilon=epsilon),
        _scale("tensornet.AdaGrad", initial_scale),
        _policy(
            "tensornet.AdaGrad", show_decay_rate, show_threshold, no_show_days, elimination_logic
        ),
    )


def Adam(  # noqa: N802 -- TensorNet's name
    learning_rate: float = 0.001,
    show_decay_rate: float = 0.98,
    beta1: float = 0.9,
    beta2: float = 0.999,
    epsilon: float = 1e-8,
    initial_scale: float = 1.0,
) -> SparseSettings:
    """Return TensorNet's ``tensornet.core.Adam(...)``: Adam without bias correction, no eviction.

    TensorNet's ``learning_rate`` has no default; 0.001 is Adam's usual one.
    """
    return SparseSettings(
        _Adam(
            learning_rate=learning_rate,
            beta1=beta1,
            beta2=beta2,
            epsilon=epsilon,
            bias_correction=False,
        ),
        _scale("tensornet.Adam", initial_scale),
        EvictionPolicy(show_decay_rate=show_decay_rate),
    )


def Ftrl(  # noqa: N802 -- TensorNet's name
    learning_rate: float = 0.05,
    show_decay_rate: float = 0.98,
    show_threshold: float = 0.0,
    beta: float = 1.0,
    lambda1: float = 0.1,
    lambda2: float = 1.0,
    initial_scale: float = 1.0,
) -> SparseSettings:
    """Return TensorNet's ``tensornet.core.Ftrl(...)``: ``alpha = 1 / learning_rate``.

    TensorNet's ``learning_rate`` has no default; 0.05 gives tnrec's ``alpha`` 20.

    Raises:
        ArgumentError: ``learning_rate`` not a positive number, or another value
            out of range.
    """
    if not isinstance(learning_rate, (int, float)) or not learning_rate > 0:
        raise ArgumentError(
            "tensornet.Ftrl: `learning_rate` must be a positive number (tnrec's alpha is its "
            f"inverse). Received: learning_rate={learning_rate!r}."
        )
    return SparseSettings(
        _Ftrl(learning_rate=1.0 / learning_rate, beta=beta, l1=lambda1, l2=lambda2),
        _scale("tensornet.Ftrl", initial_scale),
        _policy("tensornet.Ftrl", show_decay_rate, show_threshold, None, 0),
    )


def category_column(key: str, bucket_size: int = 1024) -> fc.CategoryColumn:
    """Return TensorNet's ``category_column``: a column of 64-bit signs, used unhashed.

    Raises:
        ArgumentError: ``bucket_size`` is not a positive int.
    """
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size <= 0:
        raise ArgumentError(
            f'tensornet.category_column "{key}": `bucket_size` must be a positive int. '
            f"Received: bucket_size={bucket_size!r}."
        )
    return fc.category_column(key, dtype="sign")


def embedding_column(
    categorical: fc.CategoricalColumn, dimension: int, combiner: str = "mean"
) -> fc.EmbeddingColumn:
    """Return ``tf.feature_column.embedding_column``'s equivalent: combiner ``"mean"``."""
    return fc.embedding_column(categorical, dimension=dimension, combiner=combiner)  # type: ignore[arg-type]


def EmbeddingFeatures(  # noqa: N802 -- TensorNet's name
    feature_columns: Sequence[fc.EmbeddingColumn],
    sparse_opt: SparseSettings,
    trainable: bool = True,
    name: str | None = None,
    is_concat: bool = False,
    target_columns: Sequence[str] | None = None,
    embedding_share: str | None = None,
) -> _EmbeddingFeatures:
    """Return TensorNet's ``tensornet.layers.EmbeddingFeatures`` as a tnrec layer.

    ``is_concat`` is ``output="concat"``; ``embedding_share`` names the shared
    table (``table=``); ``target_columns`` turns on CVM (``cvm=True``; the click
    statistic comes from the model's label); ``trainable=False`` freezes the table.

    Raises:
        ArgumentError: ``sparse_opt`` is not one of :func:`AdaGrad`, :func:`Adam`,
            :func:`Ftrl`.
    """
    if not isinstance(sparse_opt, SparseSettings):
        raise ArgumentError(
            "tensornet.EmbeddingFeatures: `sparse_opt` must come from "
            "tnrec.compat.tensornet.AdaGrad/Adam/Ftrl. "
            f"Received: {type(sparse_opt).__name__}."
        )
    return _EmbeddingFeatures(
        feature_columns,
        sparse_opt.optimizer,
        name=name,
        table=embedding_share,
        output="concat" if is_concat else "list",
        initializer=sparse_opt.initializer,
        policy=sparse_opt.policy,
        cvm=bool(target_columns),
        trainable=trainable,
    )


def TNBatchNormalization(  # noqa: N802 -- TensorNet's name
    num_features: int,
    center: bool = True,
    scale: bool = True,
    epsilon: float = 1e-5,
    momentum: float = 0.99,
    name: str | None = None,
    synchronized: bool = False,
    sync_freq: int = 1,
    max_count: int = 100_000,
) -> BatchNormalization:
    """Return TensorNet's ``TNBatchNormalization`` with its defaults (``synchronized=False``).

    ``name`` is accepted for TensorNet's signature; a tnrec layer is named by
    its attribute in the model.
    """
    return BatchNormalization(
        num_features,
        center=center,
        scale=scale,
        epsilon=epsilon,
        momentum=momentum,
        synchronized=synchronized,
        sync_freq=sync_freq,
        max_count=max_count,
    )


def PCTRDNNBatchNormalization(  # noqa: N802 -- TensorNet's name
    num_features: int, **kwargs: Any
) -> PCTRBatchNormalization:
    """Return TensorNet's ``PCTRDNNBatchNormalization`` (the arguments of the one above).

    Only ``synchronized``'s default differs from tnrec's layer; ``name`` is accepted
    and not used, as above.
    """
    kwargs.pop("name", None)
    return PCTRBatchNormalization(num_features, **{"synchronized": False, **kwargs})
