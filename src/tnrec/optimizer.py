"""Optimizer configs: the sparse ones of :mod:`tnrec.table`, and their dense mapping.

The same config objects serve both sides. As a layer's ``sparse_optimizer``
they run on the table (row-wise AdaGrad, Adam with per-row step, FTRL, SGD).
As ``Model.compile(dense_optimizer=...)`` they map to the ``torch.optim``
optimizer of the same name:

=================  ===========================================================
config             dense optimizer
=================  ===========================================================
``SGD``            ``torch.optim.SGD(lr)``
``AdaGrad``        ``torch.optim.Adagrad(lr, initial_accumulator_value=initial_g2sum, eps)``
                   (per element, as dense layers expect)
``Adam``           ``torch.optim.Adam(lr, betas=(beta1, beta2), eps)`` (always bias-corrected)
``Ftrl``           refused: FTRL is a sparse rule
=================  ===========================================================

Any ``torch.optim.Optimizer`` may be passed instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from tnrec.errors import ArgumentError
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseOptimizer

__all__ = ["SGD", "AdaGrad", "Adam", "Ftrl", "SparseOptimizer", "dense_optimizer"]


def dense_optimizer(
    config: SparseOptimizer | torch.optim.Optimizer, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """Return a ``torch.optim`` optimizer for ``config`` over ``params``.

    Args:
        config: a tnrec optimizer config, or a ready ``torch.optim.Optimizer``
            (returned as is).
        params: the dense parameters.

    Raises:
        ArgumentError: ``config`` is ``Ftrl`` or not an optimizer.
    """
    if isinstance(config, torch.optim.Optimizer):
        return config
    if isinstance(config, Adam):
        return torch.optim.Adam(
            params, lr=config.learning_rate, betas=(config.beta1, config.beta2), eps=config.epsilon
        )
    if isinstance(config, AdaGrad):
        return torch.optim.Adagrad(
            params,
            lr=config.learning_rate,
            initial_accumulator_value=config.initial_g2sum,
            eps=config.epsilon,
        )
    if isinstance(config, SGD):
        return torch.optim.SGD(params, lr=config.learning_rate)
    if isinstance(config, Ftrl):
        raise ArgumentError(
            "`dense_optimizer`: Ftrl is a sparse rule; use Adam, AdaGrad, SGD or a torch.optim "
            "optimizer for the dense parameters."
        )
    raise ArgumentError(
        "`dense_optimizer` must be tn.optimizer.Adam/AdaGrad/SGD or a torch.optim.Optimizer. "
        f"Received: {type(config).__name__}."
    )
