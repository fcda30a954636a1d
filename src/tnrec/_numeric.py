"""Sums over NumPy vectors that keep off NumPy's BLAS.

``a @ b`` on two float64 vectors goes to NumPy's BLAS (OpenBLAS in the
wheels), whose worker threads keep spinning for a while after each call.
Beside torch's threads on every core they take a core away: at 2 threads on
2 cores, a ``@`` of the AUC histogram's length after every fifth step took
the micro model's median step from 3.2 to 7.3 ms (``bench/blas_bench.py``;
``docs/performance.md``, Two threads and torch's OpenMP workers). What a
training process computes per step or per progress line -- the metrics, the
zoo models' initial bias -- sums with :func:`dot` instead.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def dot(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    """Return ``Σ a·b``, multiplied and summed by NumPy (pairwise summation), not by BLAS.

    Example:
        >>> dot(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
        11.0
    """
    return float(np.multiply(a, b).sum())
