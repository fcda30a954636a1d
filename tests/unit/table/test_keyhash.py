"""mix64 and bucket_of are part of the on-disk format: their outputs are pinned."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.errors import ArgumentError
from tnrec.table import NUM_BUCKETS, bucket_of, mix64

PINNED = [
    pytest.param(0, 0xE220A8397B1DCDAF, 431, id="0"),
    pytest.param(1, 0x910A2DEC89025CC1, 193, id="1"),
    pytest.param(-1, 0xE4D971771B652C20, 32, id="-1"),
    pytest.param(INT64_MIN, 0x481EC0A212A9F3DB, 987, id="int64-min"),
    pytest.param(INT64_MAX, 0x2A67D7552E039EA7, 679, id="int64-max"),
]


@pytest.mark.parametrize(("key", "mixed", "bucket"), PINNED)
def test_pinned_values(key, mixed, bucket):
    k = np.array([key], dtype=np.int64)
    assert int(mix64(k)[0]) == mixed
    assert int(bucket_of(k)[0]) == bucket
    assert mixed % NUM_BUCKETS == bucket


def test_splitmix64_reference_sequence():
    # splitmix64 seeded with 0 yields mix64(0), mix64(golden), mix64(2*golden), ...
    golden = 0x9E3779B97F4A7C15
    keys = np.array([0, golden - 2**64], dtype=np.int64)
    assert [int(x) for x in mix64(keys)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


@given(st.lists(st.integers(INT64_MIN, INT64_MAX), max_size=50))
def test_bucket_range_and_python_reference(values):
    keys = np.array(values, dtype=np.int64)
    b = bucket_of(keys)
    assert b.dtype == np.int64 and ((b >= 0) & (b < NUM_BUCKETS)).all()
    mask = 2**64 - 1
    for v, got in zip(values, mix64(keys), strict=True):
        z = (v + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        assert int(got) == z ^ (z >> 31)


def test_rejects_non_int64():
    with pytest.raises(ArgumentError, match="1-D int64 array"):
        mix64(np.array([1, 2], dtype=np.int32))
    with pytest.raises(ArgumentError, match="num_buckets"):
        bucket_of(np.array([1], dtype=np.int64), 0)
