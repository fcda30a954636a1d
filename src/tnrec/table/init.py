"""Initializers: the first vector of a key, a pure function of (seed, table name, key).

A counter-based generator: the key's stream is seeded by
``mix64(key ^ mix64(mix64(seed) ^ name_hash))``, element ``j`` draws from
``mix64(stream + (j + 1) * golden)``. So a key starts with the same vector on
whichever worker creates it, in whatever order keys arrive, and two tables with
different names never start correlated. Normals come from Box-Muller over pairs
of such uniforms, computed in float64 and stored as float32.

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

from tnrec.errors import ArgumentError
from tnrec.table.keyhash import mix64_scalar

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
def _uniform01(stream, j):  # pragma: no cover - compiled
    u = mix64_scalar(stream + np.uint64(j + 1) * _GOLDEN)
    return np.float64(u >> np.uint64(11)) * _TWO_POW_M53


@nb.njit(nogil=True, cache=True, inline="always")
def init_weights(c, l, key, table_seed, init_kind, param, D):  # pragma: no cover - compiled
    """Write the initial weights of ``key`` into row ``l`` of chunk ``c``."""
    if init_kind == INIT_ZEROS:
        for j in range(D):
            c[l, j] = np.float32(0.0)
        return
    stream = mix64_scalar(np.uint64(key) ^ table_seed)
    if init_kind == INIT_UNIFORM:
        for j in range(D):
            c[l, j] = np.float32((2.0 * _uniform01(stream, j) - 1.0) * param)
        return
    std = param / math.sqrt(D)
    for p in range((D + 1) // 2):
        u1 = _uniform01(stream, 2 * p)
        u2 = _uniform01(stream, 2 * p + 1)
        r = math.sqrt(-2.0 * math.log(1.0 - u1))
        c[l, 2 * p] = np.float32(r * math.cos(2.0 * math.pi * u2) * std)
        if 2 * p + 1 < D:
            c[l, 2 * p + 1] = np.float32(r * math.sin(2.0 * math.pi * u2) * std)
