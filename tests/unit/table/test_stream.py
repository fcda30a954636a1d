"""Streamed bucket-order saves and loads: exact rows, bounded memory, damage found in the stream."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tnrec.errors import ChecksumError
from tnrec.table import SGD, AdaGrad, Adam, Ftrl, SparseTable, bucket_of, files, stream


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(stream, "CHUNK_BYTES", 4096)  # many chunks even for small tables
    monkeypatch.setattr(stream, "LOAD_CHUNK_BYTES", 4096)


def trained(opt, n=20_000, dim=3):
    t = SparseTable(dim, opt, name="s", seed=2)
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n))
    t.pull(keys)
    g = rng.normal(size=(keys.shape[0], dim)).astype(np.float32)
    ones = np.ones(keys.shape[0], np.float32)
    t.push(keys, g, ones, ones)
    t.delete(keys[::7])  # free rows: the store has holes
    return t


@pytest.mark.parametrize("opt", [SGD(0.1), AdaGrad(0.1), Adam(0.01), Ftrl(0.1)])
def test_bucket_order_round_trip_is_exact(tmp_path, opt):
    t = trained(opt)
    t.save(tmp_path / "t", order="bucket")
    got = SparseTable.load(tmp_path / "t")
    want = t.rows()
    for name, arr in got.rows().items():
        np.testing.assert_array_equal(arr, want[name], err_msg=name)
    keys = np.load(tmp_path / "t" / "keys.npy")
    assert (np.diff(bucket_of(keys)) >= 0).all()  # grouped by bucket
    offsets = np.load(tmp_path / "t" / "bucket_offsets.npy")
    np.testing.assert_array_equal(np.diff(offsets), np.bincount(bucket_of(keys), minlength=1024))


def test_loading_some_buckets_reads_exactly_them(tmp_path):
    t = trained(AdaGrad(0.1))
    t.save(tmp_path / "t", order="bucket")
    mine = np.arange(1024) % 3 == 1
    part = SparseTable(3, AdaGrad(0.1), name="s", seed=2)
    files.load_into(part, str(tmp_path / "t"), buckets=mine)
    keys = t.keys()
    np.testing.assert_array_equal(part.keys(), keys[mine[bucket_of(keys)]])
    evens = SparseTable(3, AdaGrad(0.1), name="s", seed=2)
    evens.load_rows(tmp_path / "t", key_filter=lambda k: k % 2 == 0)
    np.testing.assert_array_equal(evens.keys(), keys[keys % 2 == 0])


def test_an_empty_table_round_trips(tmp_path):
    t = SparseTable(4, SGD(), name="e")
    t.save(tmp_path / "e", order="bucket")
    got = SparseTable.load(tmp_path / "e")
    assert len(got) == 0 and np.load(tmp_path / "e" / "weights.npy").shape == (0, 4)


def test_a_byte_changed_deep_in_a_file_is_found_while_streaming(tmp_path):
    t = trained(AdaGrad(0.1))
    t.save(tmp_path / "t", order="bucket")
    f = tmp_path / "t" / "weights.npy"
    data = bytearray(f.read_bytes())
    data[len(data) * 3 // 4] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"weights\.npy is corrupt"):
        SparseTable.load(tmp_path / "t")
    target = SparseTable(3, AdaGrad(0.1), name="s", seed=2)
    target.pull(np.array([1, 2], np.int64))
    with pytest.raises(ChecksumError, match=r"weights\.npy"):
        target.load_rows(tmp_path / "t")  # a merge verifies first: nothing half-merged
    assert target.keys().tolist() == [1, 2]


def test_a_damaged_part_gives_the_model_its_previous_tables_back(tmp_path):
    import torch

    import tnrec as tn

    fc = tn.feature_column
    col = fc.embedding_column(fc.category_column("u"), 4)

    class M(tn.Model):
        def __init__(self):
            super().__init__()
            self.emb = tn.layers.EmbeddingFeatures([col], AdaGrad(0.1), output="concat")
            self.out = torch.nn.Linear(4, 1)

        def forward_dense(self, pooled, dense):
            return self.out(pooled["emb"])

    m = M()
    m.compile(tn.optimizer.Adam(0.01), loss="mse")
    m.tables["emb"].pull(np.arange(5000, dtype=np.int64))
    m.save_weights(str(tmp_path / "ckpt"), "d1")
    part = next((tmp_path / "ckpt").rglob("weights.npy"))
    data = bytearray(part.read_bytes())
    data[-5] ^= 1
    part.write_bytes(bytes(data))
    fresh = M()
    fresh.compile(tn.optimizer.Adam(0.01), loss="mse")
    fresh.tables["emb"].pull(np.array([42], np.int64))
    before = fresh.tables["emb"]
    with pytest.raises(ChecksumError, match=r"weights\.npy"):
        fresh.load_weights(str(tmp_path / "ckpt"))
    assert fresh.tables["emb"] is before and before.keys().tolist() == [42]


SAVE_PEAK = textwrap.dedent(
    """
    import sys, numpy as np
    from tnrec.table import SparseTable, AdaGrad, mix64

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    n = int(sys.argv[2])
    t = SparseTable(16, AdaGrad(0.1), name="big")
    for a in range(0, n, 500_000):
        t.pull_unchecked(mix64(np.arange(a, min(n, a + 500_000), dtype=np.int64)).view(np.int64))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak to the current RSS
    before = hwm()
    t.save(sys.argv[1], order="bucket")
    print(hwm() - before, t.stats().bytes_held)
    """
)


def test_a_streamed_save_grows_memory_by_a_bounded_share_of_the_table(tmp_path):
    env = dict(os.environ, TNREC_TABLE_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", SAVE_PEAK, str(tmp_path / "big"), "3000000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    ).stdout.split()
    growth, table_bytes = int(out[0]), int(out[1])
    assert table_bytes > 250 << 20
    # slot order (4 B a key) + two 16 MiB chunks in flight + one column copy; a save that
    # copied the table first grew by more than the table itself
    assert growth < 0.3 * table_bytes, (growth, table_bytes)
    loaded = np.load(tmp_path / "big" / "keys.npy", mmap_mode="r")
    assert loaded.shape == (3_000_000,)


def test_a_load_into_an_empty_table_inserts_by_region_and_finds_every_key(tmp_path):
    from tnrec.table import set_num_threads
    from tnrec.table.threads import get_num_threads

    t = trained(SGD(0.1), n=60_000)
    t.save(tmp_path / "t", order="bucket")
    keys = t.keys()
    before = get_num_threads()
    layouts = []
    try:
        for threads in (1, 2, 3):
            set_num_threads(threads)
            got = SparseTable.load(tmp_path / "t")
            np.testing.assert_array_equal(got.keys(), keys)
            np.testing.assert_array_equal(got.pull(keys, create=False), t.pull(keys, create=False))
            assert got.bucket_rows().tolist() == t.bucket_rows().tolist()
            layouts.append(got._slots.copy())
    finally:
        set_num_threads(before)
    for other in layouts[1:]:  # 16 fixed regions: the same index on any thread count
        np.testing.assert_array_equal(other, layouts[0])
    # one big insert, cut over threads by region: the same index again
    big = []
    try:
        for threads in (1, 2):
            set_num_threads(threads)
            fresh = SparseTable(3, SGD(0.1), name="s", seed=2)
            rws = fresh.rows_for(keys, new=True)
            np.testing.assert_array_equal(rws, np.arange(keys.shape[0]))
            big.append(fresh._slots.copy())
    finally:
        set_num_threads(before)
    np.testing.assert_array_equal(big[1], big[0])
    np.testing.assert_array_equal(fresh.keys(), keys)
    # deletes (backward shift) and inserts keep working on a table built this way
    assert got.delete(keys[::3]) == keys[::3].shape[0]
    np.testing.assert_array_equal(got.keys(), np.setdiff1d(keys, keys[::3]))
    got.pull(keys)
    np.testing.assert_array_equal(got.keys(), keys)


def test_keys_that_repeat_are_refused_by_the_region_insert():
    from tnrec.errors import TableKeyError

    t = trained(SGD(0.1), n=5000)
    fresh = SparseTable(3, SGD(0.1), name="s", seed=2)
    keys = t.keys()
    with pytest.raises(TableKeyError, match="repeat or are already present"):
        fresh.rows_for(np.concatenate([keys[:10], keys[:10]]), new=True)


def test_keys_whose_probe_crosses_a_region_end_are_inserted_afterwards():
    keys = np.arange(-350, 350, dtype=np.int64) * 7919  # 700 keys in 1024 slots: long runs
    t = SparseTable(2, SGD(0.1), name="r")
    rws = t.rows_for(keys, new=True)
    assert t._slots.shape[0] == 1024  # 16 regions of 64 slots, runs cross their ends
    np.testing.assert_array_equal(np.sort(rws), np.arange(700))
    np.testing.assert_array_equal(t.keys(), np.sort(keys))
    got = np.empty(700, np.int32)
    from tnrec.table import index

    assert index.lookup(t._slots, keys, got) == 0
    np.testing.assert_array_equal(got, rws)


def test_a_byte_appended_to_a_file_is_refused(tmp_path):
    t = trained(AdaGrad(0.1))
    t.save(tmp_path / "t", order="bucket")
    with open(tmp_path / "t" / "click.npy", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ChecksumError, match=r"click\.npy is corrupt"):
        SparseTable.load(tmp_path / "t")


def test_write_blocks_equals_one_column_at_a_time():
    dim = 4
    a = SparseTable(dim, AdaGrad(0.1), name="a")
    b = SparseTable(dim, AdaGrad(0.1), name="b")
    keys = np.arange(50_000, dtype=np.int64) * 7 - 3  # more than one thread's slice
    rng = np.random.default_rng(3)
    cols = stream.columns(dim, AdaGrad(0.1).state_arrays(dim))
    blocks = []
    for c in cols:
        dt = np.float32 if c.dtype == "f4" else np.int32
        blocks.append((c.start, rng.integers(-1000, 1000, (keys.shape[0], c.width)).astype(dt)))
    ra = a.rows_for(keys, new=True)
    rb = b.rows_for(keys, new=True)
    a.write_blocks(ra, blocks)
    for start, block in blocks:  # one block a call
        b.write_blocks(rb, [(start, block)])
    for name, arr in a.rows().items():
        np.testing.assert_array_equal(arr, b.rows()[name], err_msg=name)
    with pytest.raises(RuntimeError, match="wrong shape"):
        a.write_blocks(ra, [(0, blocks[0][1][:, ::2])])  # not contiguous
    a.write_blocks(ra[:0], [(0, blocks[0][1][:0])])  # nothing to write


def test_a_table_on_tmpfs_round_trips(tmp_path):
    import shutil
    import tempfile

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this machine")
    d = tempfile.mkdtemp(dir="/dev/shm")
    try:
        t = trained(Adam(0.01))
        t.save(os.path.join(d, "t"), order="bucket")
        got = SparseTable.load(os.path.join(d, "t"))
        for name, arr in got.rows().items():
            np.testing.assert_array_equal(arr, t.rows()[name], err_msg=name)
    finally:
        shutil.rmtree(d, ignore_errors=True)
