"""The normal initializer's ziggurat: its distribution, its tables and its determinism."""

from __future__ import annotations

import math

import numpy as np

from tnrec.optimizer import SGD
from tnrec.table import SparseTable, normal
from tnrec.table import init as I


def _draws(n_keys: int, dim: int, scale: float) -> np.ndarray:
    t = SparseTable(dim, SGD(0.1), name="init", initializer=normal(scale), seed=3)
    return t.initial_vectors(np.arange(n_keys, dtype=np.int64)).astype(np.float64)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def test_normal_elements_follow_the_standard_normal_cdf():
    x = np.sort(_draws(100_000, 16, 4.0).ravel())  # std = 4 / sqrt(16) = 1
    n = x.shape[0]
    grid = np.linspace(-4.5, 4.5, 181)
    empirical = np.searchsorted(x, grid) / n
    expected = np.array([_phi(g) for g in grid])
    # Kolmogorov-Smirnov at the 0.1% level on the grid points
    assert np.abs(empirical - expected).max() < 1.95 / math.sqrt(n)
    assert abs(x.mean()) < 4 / math.sqrt(n) and abs(x.std() - 1.0) < 5 / math.sqrt(2 * n)


def test_tail_and_wedges_have_their_mass():
    x = np.abs(_draws(100_000, 16, 4.0).ravel())
    n = x.shape[0]
    # beyond the base edge r: the tail sampler's share
    p = math.erfc(I._ZR / math.sqrt(2.0))
    got = float((x > I._ZR).mean())
    assert abs(got - p) < 5 * math.sqrt(p / n)
    # each layer's outer band [X[i+1], X[i]] (its wedge) holds the normal's mass there
    for i in (1, 2, 10, 100, 500, 1000, I._LAYERS - 2):
        lo, hi = I._ZX[i + 1], I._ZX[i]
        p = 2 * (_phi(hi) - _phi(lo))
        got = float(((x >= lo) & (x < hi)).mean())
        assert abs(got - p) < 5 * math.sqrt(p / n) + 1e-6, (i, got, p)


def test_ziggurat_layers_have_equal_area_and_end_at_the_mode():
    x, fx = I._ZX, I._ZF
    f = lambda t: math.exp(-0.5 * t * t)  # noqa: E731
    r = I._ZR
    v = r * f(r) + math.sqrt(math.pi / 2) * math.erfc(r / math.sqrt(2))
    L = I._LAYERS
    assert x.shape == (L + 1,) and x[L] == 0.0 and x[1] == r
    areas = x[1:L] * (fx[2 : L + 1] - fx[1:L])  # layers 1 .. L-1
    np.testing.assert_allclose(areas, v, rtol=1e-9)
    assert abs(x[0] * f(r) - v) < 1e-15
    assert np.all(np.diff(x[1:]) < 0)
    np.testing.assert_array_equal(I._ZK, x[1:] / x[:-1])


def test_a_key_gets_the_same_vector_whatever_batch_it_arrives_in():
    keys = np.array([7, -1, 2**62, 0], dtype=np.int64)
    t = SparseTable(16, SGD(0.1), name="init", initializer=normal(1.0), seed=3)
    alone = np.stack([t.initial_vectors(keys[i : i + 1])[0] for i in range(4)])
    np.testing.assert_array_equal(t.initial_vectors(keys), alone)
    np.testing.assert_array_equal(t.pull(keys[::-1])[::-1], alone)
    assert np.all(np.isfinite(alone)) and len({row.tobytes() for row in alone}) == 4


def test_a_redrawn_element_leaves_the_other_elements_of_its_vector_alone():
    # Each element's first draw is draw j + 1 of the key's stream; an element
    # outside its layer's inner rectangle is redrawn from its own retry stream,
    # so the prefix of a longer vector is the shorter vector (same key, table, std).
    keys = np.arange(100_000, dtype=np.int64)
    short = SparseTable(4, SGD(0.1), name="init", initializer=normal(2.0), seed=3)
    long = SparseTable(16, SGD(0.1), name="init", initializer=normal(4.0), seed=3)
    a = short.initial_vectors(keys)  # std 2 / sqrt(4) = 1
    b = long.initial_vectors(keys)[:, :4]  # std 4 / sqrt(16) = 1
    np.testing.assert_array_equal(a, b)
    # some elements took the retry path: only the tail sampler goes beyond r
    assert (np.abs(b) > I._ZR).sum() >= 5
