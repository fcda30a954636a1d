"""pool_rows: the pooling kernel on NumPy arrays, as serving calls it."""

import numpy as np
import pytest
import torch

from tnrec.errors import ArgumentError
from tnrec.layers.pooling import bag_scales, pool, pool_rows

# Two columns (C = 2) of three rows (B = 3); bag c*B + b holds virtual ids:
#   column 0:  row 0: [0, 1]   row 1: []    row 2: [2]
#   column 1:  row 0: [1]      row 1: [0, 0, 2]   row 2: []
ROWS = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]], np.float32)  # [U=3, D=2]
VIDS = np.array([0, 1, 2, 1, 0, 0, 2], np.int64)  # [N=7]
OFFSETS = np.array([0, 2, 2, 3, 4, 7, 7], np.int64)  # [C*B + 1]


@pytest.mark.parametrize(
    ("combiner", "expected"),
    [
        pytest.param(
            "sum",
            [[11, 22], [0, 0], [100, 200], [10, 20], [102, 204], [0, 0]],
            id="sum",
        ),
        pytest.param(
            "mean",
            [[5.5, 11], [0, 0], [100, 200], [10, 20], [34, 68], [0, 0]],
            id="mean",
        ),
    ],
)
def test_pool_rows_sums_each_bag_times_its_scale(combiner, expected):
    scales = bag_scales(np.diff(OFFSETS), combiner)
    out = pool_rows(ROWS, VIDS, OFFSETS, scales, batch_size=3)  # [C*B, D]
    np.testing.assert_allclose(out, np.array(expected, np.float32), rtol=1e-6)
    assert out.dtype == np.float32


def test_pool_rows_is_the_forward_of_pool():
    scales = bag_scales(np.diff(OFFSETS), "sqrtn")
    ref = pool(torch.from_numpy(ROWS), VIDS, OFFSETS, scales, 3).numpy()
    np.testing.assert_array_equal(pool_rows(ROWS, VIDS, OFFSETS, scales, 3), ref)


def test_pool_rows_of_no_rows_and_bags_of_the_wrong_count():
    none = pool_rows(ROWS, VIDS[:0], np.zeros(1, np.int64), np.ones(0, np.float32), 0)
    assert none.shape == (0, 2)
    with pytest.raises(ArgumentError, match="pool_rows: 6 bags .* batch_size=4"):
        pool_rows(ROWS, VIDS, OFFSETS, np.ones(6, np.float32), batch_size=4)
    with pytest.raises(ArgumentError, match="pool_rows: 6 bags .* batch_size=0"):
        pool_rows(ROWS, VIDS, OFFSETS, np.ones(6, np.float32), batch_size=0)
