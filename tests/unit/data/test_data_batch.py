"""Tests of the Batch / Jagged containers."""

from __future__ import annotations

import numpy as np
import pytest

from tnrec.data import Batch, Jagged
from tnrec.errors import ArgumentError


def jag(keys: list[int], offsets: list[int]) -> Jagged:
    return Jagged(np.array(keys, np.int64), np.array(offsets, np.int64))


def small() -> Batch:
    # 3 rows; "a": row0 [1 2], row1 [], row2 [3]
    #   keys    [1 2 | 3]
    #   offsets [0, 2, 2, 3]
    return Batch(
        sparse={"a": jag([1, 2, 3], [0, 2, 2, 3])},
        dense=np.array([[0.5], [1.5], [2.5]], np.float32),
        dense_names=("x",),
        labels=np.array([[1, 0], [0, 1], [1, 1]], np.float32),
        label_names=("click", "buy"),
        weights=np.array([1, 2, 3], np.float32),
        row_ids=np.array([10, 11, 12], np.int64),
    )


def test_jagged_take_slice_concat():
    j = jag([1, 2, 3], [0, 2, 2, 3])
    t = j.take(np.array([2, 0, 1, 0]))
    assert t.keys.tolist() == [3, 1, 2, 1, 2] and t.offsets.tolist() == [0, 1, 3, 3, 5]
    s = j.slice(1, 3)
    assert s.keys.tolist() == [3] and s.offsets.tolist() == [0, 0, 1]
    c = Jagged.concat([j, s])
    assert c.keys.tolist() == [1, 2, 3, 3] and c.offsets.tolist() == [0, 2, 2, 3, 3, 4]
    assert j.take(np.array([], np.int64)).offsets.tolist() == [0]
    assert j.lengths().tolist() == [2, 0, 1]


def test_batch_take_slice_concat_label():
    b = small()
    t = b.take(np.array([2, 0]))
    assert t.row_ids.tolist() == [12, 10] and t.keys("a").tolist() == [3, 1, 2]
    assert t.weights is not None and t.weights.tolist() == [3, 1]
    assert t.label("buy").tolist() == [1, 0]
    c = Batch.concat([b.slice(0, 1), b.slice(1, 3)])
    assert c.keys("a").tolist() == [1, 2, 3] and c.offsets("a").tolist() == [0, 2, 2, 3]
    assert c.dense.tolist() == b.dense.tolist() and len(c) == 3
    empty = b.slice(1, 1)
    assert empty.size == 0 and empty.offsets("a").tolist() == [0]
    assert Batch.concat([empty, b]).size == 3


def test_batch_errors():
    b = small()
    with pytest.raises(ArgumentError, match=r"`name` is required when the batch has 2 labels"):
        b.label()
    with pytest.raises(
        ArgumentError, match=r"`name` must be one of \['click', 'buy'\]. Received: name='y'."
    ):
        b.label("y")
    with pytest.raises(ArgumentError, match=r"`parts` must not be empty"):
        Batch.concat([])
    other = Batch.empty(["b"], ["x"], ["click", "buy"], weights=True)
    with pytest.raises(ArgumentError, match=r"all parts must have the same columns"):
        Batch.concat([b, other])


def test_empty_batch_shapes():
    e = Batch.empty(["a", "b"], ["x", "y"], ["label"], weights=True)
    assert e.size == 0 and e.dense.shape == (0, 2) and e.labels.shape == (0, 1)
    assert e.weights is not None and e.weights.shape == (0,)
    assert e.keys("a").dtype == np.int64 and e.offsets("b").tolist() == [0]
    assert e.label().shape == (0,)
