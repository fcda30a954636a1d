"""Initializers: the first vector of a key, a pure function of (seed, table name, key).

A counter-based generator: the key's stream is seeded by
``mix64(key ^ mix64(mix64(seed) ^ name_hash))``, its draw ``k`` is
``mix64(stream + (k + 1) * golden)`` (counter ``k + 1``). So a key starts
with the same vector on whichever worker creates it, in whatever order keys
arrive, and two tables with different names never start correlated. Uniform
element ``j`` is draw ``j``. Normal elements come from a 1024-layer ziggurat
(Marsaglia and Tsang): element ``j`` starts from draw ``j``, and one
branch-free pass, which the compiler vectorises, accepts it in about 99.6% of
the cases with a multiply and a compare. The rest (a wedge test, or beyond
r = 4.039 the tail's exponential test) draw again from the element's own
retry stream (counters ``(j + 1) * 2**32 + t``, t >= 1), so one element's
retry never shifts another's draws. Exact in distribution to float64 rounding
(the layer edges are solved here, not copied), and about 1.9 ns an element at
dim 16 (``bench/parts_bench.py``).

The formula fixes a key's vector only when the key is created: rows already
in a table, saved or loaded, keep their values whatever formula drew them.

* :func:`normal` -- TensorNet's: ``N(0, std=1/sqrt(dim)) * scale``.
* :func:`uniform` -- ``U(-a, a)``.
* :func:`zeros`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from tnrec._hashing import mix64_scalar
from tnrec.errors import ArgumentError

INIT_ZEROS = 0
INIT_NORMAL = 1
INIT_UNIFORM = 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TWO_POW_M53 = 1.0 / 9007199254740992.0


@dataclass(frozen=True)
class Initializer:
    """How the weights of a new key are drawn: ``kind`` and one parameter.

    Build one with :func:`normal`, :func:`uniform` or :func:`zeros`.
    """

    kind: str
    param: float = 0.0

    def code(self) -> int:
        """Return the kernel's integer code for ``kind``."""
        return {"zeros": INIT_ZEROS, "normal": INIT_NORMAL, "uniform": INIT_UNIFORM}[self.kind]

    def to_config(self) -> dict[str, Any]:
        """Return a JSON-serialisable description."""
        return {"kind": self.kind, "param": self.param}

    @staticmethod
    def from_config(config: dict[str, Any]) -> Initializer:
        """Rebuild an initializer from :meth:`to_config` output."""
        kind = config.get("kind")
        param = float(config.get("param", 0.0))
        if kind == "normal":
            return normal(param)
        if kind == "uniform":
            return uniform(param)
        if kind == "zeros":
            return zeros()
        raise ArgumentError(
            f"Unknown initializer kind {kind!r}; expected 'normal', 'uniform' or 'zeros'."
        )


def normal(scale: float = 1.0) -> Initializer:
    """Return TensorNet's initializer ``N(0, std=1/sqrt(dim)) * scale``.

    Args:
        scale: TensorNet's ``initial_scale``; finite and >= 0.
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ArgumentError(f"normal(): `scale` must be a finite number >= 0. Received: {scale!r}.")
    return Initializer("normal", float(scale))


def uniform(a: float = 0.05) -> Initializer:
    """Return ``U(-a, a)``.

    Args:
        a: half-width; finite and >= 0.
    """
    if not (isinstance(a, (int, float)) and math.isfinite(a) and a >= 0):
        raise ArgumentError(f"uniform(): `a` must be a finite number >= 0. Received: {a!r}.")
    return Initializer("uniform", float(a))


def zeros() -> Initializer:
    """Return the all-zeros initializer."""
    return Initializer("zeros", 0.0)


def table_stream_seed(seed: int, name: str) -> np.uint64:
    """Mix the table's seed and name into the per-table stream seed."""
    name_hash = int.from_bytes(
        hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little"
    )
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    mixed = int(mix64_scalar(np.uint64(s)))
    return np.uint64(int(mix64_scalar(np.uint64(mixed ^ name_hash))))


@nb.njit(nogil=True, cache=True, inline="always")
def _uniform01(stream: np.uint64, j: int) -> float:  # pragma: no cover - compiled
    u = mix64_scalar(stream + np.uint64(j + 1) * _GOLDEN)
    return np.float64(u >> np.uint64(11)) * _TWO_POW_M53


@nb.njit(nogil=True, cache=True, inline="always")
def _open01(u: np.uint64) -> float:  # pragma: no cover - compiled
    """The open-interval uniform in (0, 1) of a draw's top 53 bits, plus half a step."""
    return (np.float64(u >> np.uint64(11)) + 0.5) * _TWO_POW_M53


# The ziggurat (Marsaglia and Tsang, 2000) for f(x) = exp(-x^2 / 2), 1024 layers of
# equal area v: layer 0 is the base [0, r] x [0, f(r)] plus the tail beyond r,
# seen as a rectangle of width X[0] = v / f(r); layer i >= 1 is
# [0, X[i]] x [f(X[i]), f(X[i + 1])], with X[1] = r and X[1024] = 0. r is solved
# here, in float64, so that the layers end exactly at the mode.
_LAYER_BITS = 10
_LAYERS = 1 << _LAYER_BITS
_LAYER_MASK = np.uint64(_LAYERS - 1)
_SIGN_BIT = np.uint64(_LAYER_BITS)  # the draw's bit after the layer's; the top 53 bits: u
_RETRY = np.uint64(1 << 32)  # element j's further draws: counters (j + 1) * 2**32 + t, t >= 1


def _ziggurat() -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Return ``(X[L + 1], f(X)[L + 1], X[i+1] / X[i] [L], r)`` for ``L = _LAYERS``."""

    def f(x: float) -> float:
        return math.exp(-0.5 * x * x)

    def layers(r: float) -> tuple[list[float], float]:
        """X[1 .. L-1] for base edge ``r``, and by how much the last layer overshoots 1."""
        v = r * f(r) + math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))
        xs = [v / f(r), r]
        for _ in range(_LAYERS - 2):
            a = v / xs[-1] + f(xs[-1])
            if a >= 1.0:  # out of height before the last layer: r is too small
                return xs, 1.0
            xs.append(math.sqrt(-2.0 * math.log(a)))
        return xs, v / xs[-1] + f(xs[-1]) - 1.0

    lo, hi = 3.0, 5.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if layers(mid)[1] > 0 else (lo, mid)
    xs, _ = layers(hi)
    x = np.array([*xs, 0.0], np.float64)  # [L + 1]
    fx = np.exp(-0.5 * x * x)
    return x, fx, x[1:] / x[:-1], hi


_ZX, _ZF, _ZK, _ZR = _ziggurat()


@nb.njit(nogil=True, cache=True, inline="always")
def _draw(stream: np.uint64, c: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """The key stream's draw with counter ``c`` (>= 1)."""
    return mix64_scalar(stream + c * _GOLDEN)


@nb.njit(nogil=True, cache=True)
def _ziggurat_retry(stream: np.uint64, j: int, w: np.uint64) -> float:  # pragma: no cover
    """Element ``j``'s standard normal when its first draw ``w`` fell outside its layer's
    inner rectangle (about 0.4% of the elements).

    Layer 0 samples the tail beyond r (Marsaglia's exponential test); a layer
    >= 1 accepts ``u * X[i]`` when a uniform height over the wedge falls under
    the curve; a rejected draw is replaced by the next draw of the element's
    own retry stream, which goes through the ziggurat again.
    """
    base = np.uint64(j + 1) * _RETRY
    t = np.uint64(0)
    while True:
        i = int(w & _LAYER_MASK)
        u = _open01(w)
        if u < _ZK[i]:
            z = u * _ZX[i]
            break
        if i == 0:
            while True:
                a = -math.log(_open01(_draw(stream, base + t + np.uint64(1)))) / _ZR
                b = -math.log(_open01(_draw(stream, base + t + np.uint64(2))))
                t += np.uint64(2)
                if 2.0 * b > a * a:
                    break
            z = _ZR + a
            break
        z = u * _ZX[i]
        h = _open01(_draw(stream, base + t + np.uint64(1)))
        if _ZF[i] + h * (_ZF[i + 1] - _ZF[i]) < math.exp(-0.5 * z * z):
            break
        w = _draw(stream, base + t + np.uint64(2))
        t += np.uint64(2)
    return z * np.float64(1 - 2 * np.int64((w >> _SIGN_BIT) & np.uint64(1)))


@nb.njit(nogil=True, cache=True, inline="always")
def _normals(c_out: Any, stream: np.uint64, D: int, std: float) -> None:  # pragma: no cover
    """Write ``D`` standard normals times ``std`` from ``stream`` into ``c_out[0 .. D-1]``.

    Element ``j`` starts from the draw with counter ``j + 1``: its low 10 bits
    pick the layer, bit 10 the sign, the top 53 the position in the layer. One
    branch-free pass writes every element as if its draw fell inside its
    layer's inner rectangle (the compiler vectorises it); the few elements
    whose draw did not are then redrawn from their own retry streams, so one
    element's retry never shifts another element's draws.
    """
    outside = 0
    for j in range(D):
        w = _draw(stream, np.uint64(j + 1))
        i = w & _LAYER_MASK
        u = _open01(w)
        outside += u >= _ZK[i]
        # the sign as a factor, not a branch: a random bit mispredicts half the time
        sign = np.float64(1 - 2 * np.int64((w >> _SIGN_BIT) & np.uint64(1)))
        c_out[j] = np.float32(u * _ZX[i] * (sign * std))
    if outside:
        for j in range(D):
            w = _draw(stream, np.uint64(j + 1))
            if _open01(w) >= _ZK[w & _LAYER_MASK]:
                c_out[j] = np.float32(_ziggurat_retry(stream, j, w) * std)


@nb.njit(nogil=True, cache=True, inline="always")
def init_weights(
    c: Any, key: int, table_seed: np.uint64, init_kind: int, param: float, D: int
) -> None:  # pragma: no cover - compiled
    """Write the initial weights of ``key`` into the row at ``c`` (a float32 pointer)."""
    if init_kind == INIT_ZEROS:
        for j in range(D):
            c[j] = np.float32(0.0)
        return
    stream = mix64_scalar(np.uint64(key) ^ table_seed)
    if init_kind == INIT_UNIFORM:
        for j in range(D):
            c[j] = np.float32((2.0 * _uniform01(stream, j) - 1.0) * param)
        return
    _normals(c, stream, D, param / math.sqrt(D))
