"""Two workers under torchrun train on one TFRecord file: every good record once, uneven parts."""

import os

import numpy as np

from tests.unit.data.tfrecord_writer import encode_example, write_records

HERE = os.path.dirname(os.path.abspath(__file__))


def write_file(path):
    """13 records; record 5 (worker 1's) has a damaged data byte."""
    rng = np.random.default_rng(3)
    records = []
    for i in range(13):
        feats = {
            "user": ("int64", [int(rng.integers(0, 20))]),
            "item": ("int64", [int(rng.integers(0, 9)) + (1 << 40)]),
            "tags": ("int64", [int(v) for v in rng.integers(0, 12, i % 3)]),
            "d0": ("float", [float(rng.normal())]),
            "d1": ("int64", [int(rng.integers(-5, 5))]),
            "label": ("int64", [i % 2]),
        }
        records.append(encode_example(feats))
    write_records(path, records)
    data = bytearray(path.read_bytes())
    at = sum(16 + len(r) for r in records[:5]) + 12  # record 5's first data byte
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def test_two_workers_train_every_good_record_once(launch, tmp_path):
    path = tmp_path / "day.tfrecord"
    write_file(path)
    res = launch(2, [str(tmp_path), str(path)], target=[os.path.join(HERE, "tfrecord_scenario.py")])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = [dict(np.load(tmp_path / f"tfrecord-rank{r}.npz")) for r in range(2)]
    # worker 0: records 0, 2, ..., 12 (4 batches of 2); worker 1: 1, 3, 7, 9, 11 (3 batches)
    assert sorted(parts[0]["trained_rows"].tolist()) == [0, 2, 4, 6, 8, 10, 12]
    assert sorted(parts[1]["trained_rows"].tolist()) == [1, 3, 7, 9, 11]
    assert int(parts[0]["bad_rows"]) == 0 and int(parts[1]["bad_rows"]) == 1
