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

:func:`pcgrad` is the gradient surgery ``Model.compile(pcgrad=True)`` applies
to the dense gradients of a model with several heads.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tnrec.errors import ArgumentError
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseOptimizer

__all__ = ["SGD", "AdaGrad", "Adam", "Ftrl", "SparseOptimizer", "dense_optimizer", "pcgrad"]


def dense_optimizer(
    config: SparseOptimizer | torch.optim.Optimizer, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """Return a ``torch.optim`` optimizer for ``config`` over ``params``.

    Args:
        config: a tnrec optimizer config, or a ready ``torch.optim.Optimizer``
            (returned as is). :class:`Adam` gives ``torch.optim.Adam(fused=True)``
            where torch has the fused kernel for the parameters' device, else
            the default implementation.
        params: the dense parameters.

    Raises:
        ArgumentError: ``config`` is ``Ftrl`` or not an optimizer.
    """
    if isinstance(config, torch.optim.Optimizer):
        return config
    if isinstance(config, Adam):
        params = list(params)
        kwargs: dict[str, Any] = {
            "lr": config.learning_rate,
            "betas": (config.beta1, config.beta2),
            "eps": config.epsilon,
        }
        try:  # one kernel for all parameters (bench/parts_bench.py)
            return torch.optim.Adam(params, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):  # a torch without fused Adam on CPU
            return torch.optim.Adam(params, **kwargs)
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


def pcgrad(task_grads: torch.Tensor) -> torch.Tensor:
    """Return the PCGrad combination of per-task gradients ``[T, P]``: ``[P]``.

    Yu et al. 2020, "Gradient Surgery for Multi-Task Learning": each task's
    gradient ``g_i`` is projected, for every other task ``j`` in index order
    (deterministic, so reruns and W workers agree), onto the normal plane of
    the *original* ``g_j`` when they conflict::

        if g_i . g_j < 0:  g_i <- g_i - (g_i . g_j) / |g_j|^2 * g_j

    and the projected gradients are summed. Without conflicts the result is
    the plain sum. Computed in float64, returned in the input's dtype.

    Args:
        task_grads: ``[T, P]``, one flattened gradient per task (T >= 1).

    Returns:
        ``[P]``: the sum of the projected task gradients.

    Raises:
        ArgumentError: ``task_grads`` is not 2-D.

    Example:
        >>> pcgrad(torch.tensor([[1.0, 0.0], [-1.0, 1.0]])).tolist()
        [0.5, 1.5]
    """
    if task_grads.dim() != 2:
        raise ArgumentError(
            "pcgrad: `task_grads` must be [T, P] (one flattened gradient per task). "
            f"Received: shape {tuple(task_grads.shape)}."
        )
    g = task_grads.detach().double()  # [T, P]
    norms = (g * g).sum(1)  # [T]
    out = g.clone()  # [T, P]
    for i in range(g.shape[0]):  # T tasks: a handful, never per key
        for j in range(g.shape[0]):
            if j == i or norms[j] == 0:
                continue
            dot = torch.dot(out[i], g[j])
            if dot < 0:
                out[i] -= dot / norms[j] * g[j]
    return out.sum(0).to(task_grads.dtype)
