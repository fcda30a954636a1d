"""Table files: bit-exact round trips, bucket ranges, atomic replace, refusals."""

import json
import os

import numpy as np
import pytest

from tests.unit.keys import INT64_MAX, INT64_MIN
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    ChecksumError,
    FormatVersionError,
    MismatchError,
)
from tnrec.table import SGD, AdaGrad, Adam, EvictionPolicy, Ftrl, SparseTable, bucket_of, uniform
from tnrec.table import files as table_files


def trained_table(opt, n=3000, dim=5, seed=3):
    """A table that grew, was pushed, decayed and evicted."""
    t = SparseTable(
        dim,
        opt,
        name="item",
        seed=seed,
        initializer=uniform(0.3),
        policy=EvictionPolicy(show_threshold=0.5),
    )
    rng = np.random.default_rng(seed)
    keys = np.unique(
        np.concatenate(
            [
                rng.integers(INT64_MIN, INT64_MAX, size=n, dtype=np.int64),
                np.array([0, -1, INT64_MIN, INT64_MAX], dtype=np.int64),
            ]
        )
    )
    for step in range(3):
        t.generation = step + 1
        batch = np.unique(rng.choice(keys, size=n // 2))
        t.pull(batch)
        g = rng.normal(size=(batch.shape[0], dim)).astype(np.float32)
        show = rng.integers(0, 3, size=batch.shape[0]).astype(np.float32)
        t.push(batch, g, show, (show > 1).astype(np.float32))
        t.show_decay(1)
    assert t.evict() > 0
    t.pull(keys[:10])  # reuse freed rows
    return t


def assert_same_rows(a, b):
    ra, rb = a.rows(), b.rows()
    assert ra.keys() == rb.keys()
    for name in ra:
        assert ra[name].dtype == rb[name].dtype, name
        np.testing.assert_array_equal(ra[name], rb[name], err_msg=name)


OPTS = [
    pytest.param(SGD(0.1), id="sgd"),
    pytest.param(AdaGrad(0.05, initial_g2sum=0.1), id="adagrad"),
    pytest.param(Adam(0.01), id="adam"),
    pytest.param(Ftrl(0.05, l1=0.01), id="ftrl"),
]


@pytest.mark.parametrize("fmt", ["npy", "txt"])
@pytest.mark.parametrize("opt", OPTS)
def test_round_trip_is_bit_exact(tmp_path, opt, fmt):
    t = trained_table(opt)
    t.save(tmp_path / "tbl", storage=fmt)
    back = SparseTable.load(tmp_path / "tbl")
    assert_same_rows(t, back)
    assert (back.name, back.dim, back.seed, back.generation) == ("item", 5, 3, 3)
    assert back.optimizer == opt and back.policy == t.policy and back.initializer == t.initializer
    # the loaded table creates new keys exactly as the original would
    fresh = np.array([123456789], dtype=np.int64)
    np.testing.assert_array_equal(back.pull(fresh), t.pull(fresh))


def test_npy_files_are_sorted_and_plain(tmp_path):
    t = trained_table(Adam())
    t.save(tmp_path / "tbl")
    keys = np.load(tmp_path / "tbl" / "keys.npy", allow_pickle=False)
    assert (np.diff(keys) > 0).all() and keys.shape[0] == len(t)
    header = json.loads((tmp_path / "tbl" / "table.json").read_text())
    assert set(header["files"]) == {
        "keys.npy",
        "weights.npy",
        "m.npy",
        "v.npy",
        "step.npy",
        "show.npy",
        "click.npy",
        "unseen_days.npy",
        "marker.npy",
    }
    assert header["count"] == len(t) and header["format_version"] == 2
    assert np.load(tmp_path / "tbl" / "step.npy").dtype == np.int32


def test_empty_table_round_trip(tmp_path):
    for fmt in ("npy", "txt"):
        t = SparseTable(3, AdaGrad(), name="e")
        t.save(tmp_path / fmt, storage=fmt)
        back = SparseTable.load(tmp_path / fmt)
        assert len(back) == 0 and back.dim == 3


def test_save_range_and_key_filter_partition_the_table(tmp_path):
    t = trained_table(AdaGrad())
    ranges = [(0, 300), (300, 301), (301, 1024)]
    for lo, hi in ranges:
        t.save_range(tmp_path / f"b{lo}-{hi}", lo, hi)
    merged = SparseTable(5, AdaGrad(0.05, initial_g2sum=0.1), name="item")
    total = sum(merged.load_rows(tmp_path / f"b{lo}-{hi}") for lo, hi in ranges)
    assert total == len(t)
    assert_same_rows(t, merged)
    part = SparseTable.load(tmp_path / "b0-300", key_filter=lambda k: k % 2 == 0)
    expect = t.keys()
    b = bucket_of(expect)
    expect = expect[(b < 300) & (expect % 2 == 0)]
    np.testing.assert_array_equal(part.keys(), expect)
    with pytest.raises(ArgumentError, match="Bucket range"):
        t.save_range(tmp_path / "bad", 10, 10)
    with pytest.raises(ArgumentError, match="key_filter"):
        SparseTable.load(tmp_path / "b0-300", key_filter=lambda k: k)


def test_save_replaces_previous_version_atomically(tmp_path):
    t = trained_table(SGD())
    t.save(tmp_path / "tbl")
    t.push(
        t.keys(),
        np.ones((len(t), 5), np.float32),
        np.zeros(len(t), np.float32),
        np.zeros(len(t), np.float32),
    )
    t.save(tmp_path / "tbl")
    assert_same_rows(t, SparseTable.load(tmp_path / "tbl"))
    assert sorted(os.listdir(tmp_path)) == ["tbl"]  # no temporary left behind


def test_crash_before_publish_leaves_previous_intact(tmp_path, monkeypatch):
    t = trained_table(AdaGrad())
    t.save(tmp_path / "tbl")
    reference = SparseTable.load(tmp_path / "tbl")
    t.push(
        t.keys(),
        np.ones((len(t), 5), np.float32),
        np.zeros(len(t), np.float32),
        np.zeros(len(t), np.float32),
    )

    def crash(tmp, path):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(table_files, "_publish", crash)
    with pytest.raises(KeyboardInterrupt):
        t.save(tmp_path / "tbl")
    assert_same_rows(reference, SparseTable.load(tmp_path / "tbl"))
    assert sorted(os.listdir(tmp_path)) == ["tbl"]


def test_crash_between_fallback_renames_is_recovered(tmp_path):
    t = trained_table(SGD())
    t.save(tmp_path / "tbl")
    # what the non-Linux fallback leaves if killed between its two renames
    os.rename(tmp_path / "tbl", tmp_path / ".tbl.old-0123456789ab")
    assert_same_rows(t, SparseTable.load(tmp_path / "tbl"))


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ArgumentError, match="not a saved table"):
        SparseTable(2, SGD(), name="x").save(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(
        ArgumentError, match=r"`storage` must be 'npy' or 'txt'\. Received: storage='parquet'"
    ):
        SparseTable(2, SGD(), name="x").save(tmp_path / "y", storage="parquet")


@pytest.fixture
def saved(tmp_path):
    t = trained_table(AdaGrad())
    t.save(tmp_path / "tbl")
    return t, tmp_path / "tbl"


def test_checksum_mismatch_is_refused(saved):
    _, path = saved
    w = path / "weights.npy"
    data = bytearray(w.read_bytes())
    data[-3] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"weights\.npy is corrupt"):
        SparseTable.load(path)


def test_truncated_and_missing_files_are_refused(saved):
    t, path = saved
    k = path / "show.npy"
    k.write_bytes(k.read_bytes()[:-8])
    with pytest.raises(ChecksumError, match=r"show\.npy"):
        SparseTable.load(path)
    (path / "click.npy").unlink()
    target = SparseTable(5, AdaGrad(), name="item")
    with pytest.raises(CheckpointError, match=r"click\.npy is missing"):
        target.load_rows(path)
    assert len(target) == 0  # never half-loaded


def test_header_faults_are_refused(saved, tmp_path):
    _, path = saved
    header = json.loads((path / "table.json").read_text())
    header["format_version"] = 99
    (path / "table.json").write_text(json.dumps(header))
    with pytest.raises(FormatVersionError, match="format_version 99 is not supported"):
        SparseTable.load(path)
    (path / "table.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"table header .*table\.json is damaged"):
        SparseTable.load(path)
    with pytest.raises(CheckpointError, match="No saved table"):
        SparseTable.load(tmp_path / "nowhere")


def test_header_checksum_refuses_a_changed_value(saved):
    _, path = saved
    text = (path / "table.json").read_text()
    (path / "table.json").write_text(text.replace('"dim": 5', '"dim": 6'))
    with pytest.raises(ChecksumError, match=r"table\.json is corrupt: its content does not match"):
        SparseTable.load(path)


def test_header_of_format_version_1_still_loads(saved):
    t, path = saved
    header = json.loads((path / "table.json").read_text())
    del header["checksum"]
    header["format_version"] = 1
    (path / "table.json").write_text(json.dumps(header))
    back = SparseTable.load(path)
    np.testing.assert_array_equal(back.rows()["weights"], t.rows()["weights"])


def test_header_field_of_the_wrong_type_is_named(saved):
    _, path = saved
    header = json.loads((path / "table.json").read_text())
    del header["checksum"]
    header["format_version"] = 1
    header["dim"] = "5"
    (path / "table.json").write_text(json.dumps(header))
    with pytest.raises(CheckpointError, match=r"table\.json: field 'dim' must be int"):
        SparseTable.load(path)


def test_dim_and_optimizer_mismatch_are_refused(saved):
    _, path = saved
    with pytest.raises(MismatchError, match="saved dim 5 != expected dim 8"):
        SparseTable.load(path, dim=8)
    with pytest.raises(MismatchError, match="saved optimizer AdaGrad != expected Adam"):
        SparseTable.load(path, optimizer=Adam())
    with pytest.raises(MismatchError, match="saved dim 5 != table 'other' dim 4"):
        SparseTable(4, AdaGrad(), name="other").load_rows(path)
    with pytest.raises(
        MismatchError, match="saved optimizer AdaGrad != table 'other' optimizer Ftrl"
    ):
        SparseTable(5, Ftrl(), name="other").load_rows(path)
    # same type, other hyper-parameters: loads, keeps the caller's config
    t = SparseTable.load(path, optimizer=AdaGrad(learning_rate=0.5))
    assert t.optimizer.learning_rate == 0.5


def test_load_rows_replaces_existing_keys(saved):
    t, path = saved
    target = SparseTable(5, AdaGrad(0.05, initial_g2sum=0.1), name="item", seed=3)
    target.pull(t.keys()[:50])
    target.push(
        t.keys()[:50],
        np.ones((50, 5), np.float32),
        np.ones(50, np.float32),
        np.ones(50, np.float32),
    )
    target.load_rows(path)
    assert_same_rows(t, target)


def test_bucket_order_lets_a_loader_read_only_its_buckets(tmp_path):
    t = trained_table(AdaGrad())
    t.save(tmp_path / "tbl")  # key order: buckets found by hashing
    table_files.save(t, str(tmp_path / "byb"), order="bucket")
    offsets = np.load(tmp_path / "byb" / "bucket_offsets.npy")
    keys = np.load(tmp_path / "byb" / "keys.npy")
    assert offsets[0] == 0 and offsets[-1] == len(t)
    np.testing.assert_array_equal(np.diff(bucket_of(keys)) >= 0, True)
    mine = np.arange(1024) % 3 == 1
    for path in ("tbl", "byb"):
        part = SparseTable(5, AdaGrad(0.05, initial_g2sum=0.1), name="item")
        header = table_files.verify(str(tmp_path / path))
        n = table_files.load_into(part, str(tmp_path / path), buckets=mine, verified=header)
        expect = t.keys()[bucket_of(t.keys()) % 3 == 1]
        assert n == expect.shape[0]
        np.testing.assert_array_equal(part.keys(), expect)
        full = t.rows(expect)
        for name, arr in part.rows().items():
            np.testing.assert_array_equal(arr, full[name], err_msg=name)
    with pytest.raises(ArgumentError, match="`order` must be 'key', or 'bucket'"):
        table_files.save(t, str(tmp_path / "x"), storage="txt", order="bucket")
