"""Sparse optimizer configs and their per-row update rules.

A config is a small mutable dataclass: the table reads its hyper-parameters at
every push, so a schedule may change ``learning_rate`` between pushes. The
update rules are numba functions inlined into the table's push kernel; each
runs exactly once per key per push, on the key's gradient summed over the step.

Arithmetic: the row is stored as float32; an update loads it, computes in
float64 and stores float32 again. ``g`` below is the row's gradient, ``D`` the
dimension.

* :class:`SGD`: ``w -= lr * g``.
* :class:`AdaGrad`, TensorNet's row-wise form (TorchRec's EXACT_ROWWISE_ADAGRAD):
  one scalar ``g2sum`` per row. ``g2sum += sum(g * g) / D``, then
  ``w -= lr * g / (epsilon + sqrt(g2sum))``. Unlike ``torch.optim.Adagrad``,
  which keeps one accumulator per element (``D`` floats of state, initial 0 by
  default), every coordinate of a row takes the same adaptive step and the
  state is one float.
* :class:`Adam`: per-element ``m``, ``v`` and a per-row step count ``t``
  (incremented when the row is pushed, so rows seen rarely get their own bias
  correction). With ``bias_correction=True``:
  ``w -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + epsilon)``; with
  ``False``, TensorNet's rule ``w -= lr * m / (sqrt(v) + epsilon)``.
* :class:`Ftrl`: FTRL-proximal (McMahan et al. 2013) per coordinate with
  ``alpha = learning_rate``. At creation ``z`` is set so that the closed form
  gives back the initializer's vector, so any initializer works.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numba as nb
import numpy as np

from tnrec.errors import ArgumentError

KIND_SGD = 0
KIND_ADAGRAD = 1
KIND_ADAM = 2
KIND_FTRL = 3


def _positive(cls: str, name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ArgumentError(
            f"{cls}: `{name}` must be a positive finite number. Received: {name}={value!r}."
        )


def _non_negative(cls: str, name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ArgumentError(
            f"{cls}: `{name}` must be a finite number >= 0. Received: {name}={value!r}."
        )


def _fraction(cls: str, name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
        raise ArgumentError(f"{cls}: `{name}` must be in [0, 1). Received: {name}={value!r}.")


@dataclass(eq=True)
class SparseOptimizer:
    """Base of the sparse optimizer configs; not used directly."""

    kind: ClassVar[int] = -1
    learning_rate: float = 0.01

    def state_arrays(self, dim: int) -> list[tuple[str, int, str]]:
        """Return ``(name, width, dtype)`` of each state array; width 0 means ``[n]``."""
        return []

    def state_width(self, dim: int) -> int:
        """Return the number of 4-byte state slots one row needs."""
        return sum(w if w else 1 for _, w, _ in self.state_arrays(dim))

    def validate(self) -> None:
        """Raise ArgumentError if a hyper-parameter is out of range."""
        _positive(type(self).__name__, "learning_rate", self.learning_rate)

    def hyper_params(self) -> np.ndarray:
        """Return the hyper-parameters as the float64 vector the kernels read."""
        self.validate()
        return np.array([self.learning_rate], dtype=np.float64)

    def to_config(self) -> dict[str, Any]:
        """Return a JSON-serialisable description (``type`` + hyper-parameters)."""
        return {"type": type(self).__name__, **asdict(self)}

    def __post_init__(self) -> None:
        self.validate()


@dataclass(eq=True)
class SGD(SparseOptimizer):
    """Plain SGD on the rows: ``w -= lr * g``.

    Example:
        >>> SGD(learning_rate=0.1)
        SGD(learning_rate=0.1)
    """

    kind: ClassVar[int] = KIND_SGD
    learning_rate: float = 0.01


@dataclass(eq=True)
class AdaGrad(SparseOptimizer):
    """Row-wise AdaGrad, TensorNet's sparse rule (one scalar ``g2sum`` per row).

    ``g2sum += sum(g*g)/D``; ``w -= lr * g / (epsilon + sqrt(g2sum))``.
    ``torch.optim.Adagrad`` instead keeps one accumulator per element.

    Example:
        >>> AdaGrad(learning_rate=0.05, initial_g2sum=0.1)
        AdaGrad(learning_rate=0.05, initial_g2sum=0.1, epsilon=1e-08)
    """

    kind: ClassVar[int] = KIND_ADAGRAD
    learning_rate: float = 0.01
    initial_g2sum: float = 0.0
    epsilon: float = 1e-8

    def state_arrays(self, dim: int) -> list[tuple[str, int, str]]:
        return [("g2sum", 0, "float32")]

    def validate(self) -> None:
        super().validate()
        _non_negative("AdaGrad", "initial_g2sum", self.initial_g2sum)
        _non_negative("AdaGrad", "epsilon", self.epsilon)

    def hyper_params(self) -> np.ndarray:
        self.validate()
        return np.array([self.learning_rate, self.initial_g2sum, self.epsilon], dtype=np.float64)


@dataclass(eq=True)
class Adam(SparseOptimizer):
    """Adam with per-element moments and a per-row step count.

    Example:
        >>> Adam(learning_rate=1e-3, bias_correction=False).bias_correction
        False
    """

    kind: ClassVar[int] = KIND_ADAM
    learning_rate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    bias_correction: bool = True

    def state_arrays(self, dim: int) -> list[tuple[str, int, str]]:
        return [("m", dim, "float32"), ("v", dim, "float32"), ("step", 0, "int32")]

    def validate(self) -> None:
        super().validate()
        _fraction("Adam", "beta1", self.beta1)
        _fraction("Adam", "beta2", self.beta2)
        _non_negative("Adam", "epsilon", self.epsilon)
        if not isinstance(self.bias_correction, bool):
            raise ArgumentError(
                f"Adam: `bias_correction` must be a bool. Received: {self.bias_correction!r}."
            )

    def hyper_params(self) -> np.ndarray:
        self.validate()
        bc = 1.0 if self.bias_correction else 0.0
        return np.array(
            [self.learning_rate, self.beta1, self.beta2, self.epsilon, bc], dtype=np.float64
        )


@dataclass(eq=True)
class Ftrl(SparseOptimizer):
    """FTRL-proximal per coordinate; ``learning_rate`` is McMahan's ``alpha``.

    ``sigma = (sqrt(n + g*g) - sqrt(n)) / alpha; z += g - sigma*w; n += g*g;``
    ``w = 0 if |z| <= l1 else -(z - sign(z)*l1) / ((beta + sqrt(n))/alpha + l2)``.

    Example:
        >>> Ftrl(learning_rate=0.05, l1=0.0).l2
        1.0
    """

    kind: ClassVar[int] = KIND_FTRL
    learning_rate: float = 0.05
    beta: float = 1.0
    l1: float = 0.1
    l2: float = 1.0

    def state_arrays(self, dim: int) -> list[tuple[str, int, str]]:
        return [("z", dim, "float32"), ("n", dim, "float32")]

    def validate(self) -> None:
        super().validate()
        _non_negative("Ftrl", "beta", self.beta)
        _non_negative("Ftrl", "l1", self.l1)
        _non_negative("Ftrl", "l2", self.l2)

    def hyper_params(self) -> np.ndarray:
        self.validate()
        return np.array([self.learning_rate, self.beta, self.l1, self.l2], dtype=np.float64)


_TYPES: dict[str, type[SparseOptimizer]] = {c.__name__: c for c in (SGD, AdaGrad, Adam, Ftrl)}
OPTIMIZERS: dict[str, type[SparseOptimizer]] = {name.lower(): c for name, c in _TYPES.items()}
"""The sparse optimizers by lower-case name (``"adagrad"``, ``"adam"``, ``"ftrl"``, ``"sgd"``)."""


def optimizer_from_config(config: dict[str, Any]) -> SparseOptimizer:
    """Rebuild an optimizer config from :meth:`SparseOptimizer.to_config` output.

    Raises:
        ArgumentError: unknown ``type`` or unknown hyper-parameter names.
    """
    cfg = dict(config)
    name = cfg.pop("type", None)
    if name not in _TYPES:
        raise ArgumentError(
            f"Unknown sparse optimizer type {name!r}; expected one of {sorted(_TYPES)}."
        )
    try:
        return _TYPES[name](**cfg)
    except TypeError as e:
        raise ArgumentError(f"Bad hyper-parameters for sparse optimizer {name}: {e}.") from None


# ---------------------------------------------------------------------------
# Row kernels. `c` points at a row's float32 slots, `ci` at the same slots as
# int32, `g` is the gradient matrix and `i` the gradient row; the state starts
# at slot D.


@nb.njit(nogil=True, cache=True, inline="always")
def update_row(
    kind: int, c: Any, ci: Any, g: np.ndarray, i: int, hp: np.ndarray, D: int
) -> None:  # pragma: no cover - compiled
    """Apply optimizer ``kind`` to one row."""
    lr = hp[0]
    if kind == KIND_SGD:
        for j in range(D):
            c[j] = np.float32(np.float64(c[j]) - lr * np.float64(g[i, j]))
    elif kind == KIND_ADAGRAD:
        eps = hp[2]
        gsq = 0.0
        for j in range(D):
            gj = np.float64(g[i, j])
            gsq += gj * gj
        g2 = np.float64(c[D]) + gsq / D
        c[D] = np.float32(g2)
        step = lr / (eps + math.sqrt(g2))
        for j in range(D):
            c[j] = np.float32(np.float64(c[j]) - step * np.float64(g[i, j]))
    elif kind == KIND_ADAM:
        b1 = hp[1]
        b2 = hp[2]
        eps = hp[3]
        t = ci[3 * D] + 1
        ci[3 * D] = t
        c1 = 1.0
        c2 = 1.0
        if hp[4] != 0.0:
            c1 = 1.0 - b1**t
            c2 = 1.0 - b2**t
        for j in range(D):
            gj = np.float64(g[i, j])
            m = b1 * np.float64(c[D + j]) + (1.0 - b1) * gj
            v = b2 * np.float64(c[2 * D + j]) + (1.0 - b2) * gj * gj
            c[D + j] = np.float32(m)
            c[2 * D + j] = np.float32(v)
            c[j] = np.float32(np.float64(c[j]) - lr * (m / c1) / (math.sqrt(v / c2) + eps))
    else:  # KIND_FTRL
        beta = hp[1]
        l1 = hp[2]
        l2 = hp[3]
        for j in range(D):
            gj = np.float64(g[i, j])
            w = np.float64(c[j])
            z = np.float64(c[D + j])
            n = np.float64(c[2 * D + j])
            n_new = n + gj * gj
            sigma = (math.sqrt(n_new) - math.sqrt(n)) / lr
            z += gj - sigma * w
            c[D + j] = np.float32(z)
            c[2 * D + j] = np.float32(n_new)
            if abs(z) <= l1:
                c[j] = np.float32(0.0)
            else:
                sz = 1.0 if z > 0 else -1.0
                c[j] = np.float32(-(z - sz * l1) / ((beta + math.sqrt(n_new)) / lr + l2))


@nb.njit(nogil=True, cache=True, inline="always")
def init_state(
    kind: int, c: Any, ci: Any, hp: np.ndarray, D: int, S: int
) -> None:  # pragma: no cover - compiled
    """Set the optimizer state of a freshly created row whose weights are written."""
    if kind == KIND_ADAGRAD:
        c[D] = np.float32(hp[1])
    elif kind == KIND_ADAM:
        for j in range(2 * D):
            c[D + j] = np.float32(0.0)
        ci[3 * D] = 0
    elif kind == KIND_FTRL:
        # Solve w(z, n=0) = w0: z = -w0 * (beta/alpha + l2) - sign(w0) * l1.
        lr = hp[0]
        scale = hp[1] / lr + hp[3]
        l1 = hp[2]
        for j in range(D):
            w0 = np.float64(c[j])
            if w0 == 0.0:
                z = 0.0
            elif w0 > 0.0:
                z = -w0 * scale - l1
            else:
                z = -w0 * scale + l1
            c[D + j] = np.float32(z)
            c[2 * D + j] = np.float32(0.0)
