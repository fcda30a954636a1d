"""Exports written by 2 workers at once equal the export of one process, exactly.

``tnrec train`` runs here in one process (two days); ``sharded_scenarios.py``
then runs on 2 workers under torchrun (127.0.0.1, gloo) and writes, each
worker its own shards: ``tnrec export`` of the 1-worker checkpoints, the same
checkpoints saved again by the 2 workers and exported, ``model.export`` under
the PsStrategy, delta exports, a model with an empty table and a worker
without keys, and a write that fails on rank 1. ``torchrun -m tnrec.cli
export`` runs once more through the real command line. The same exports are
written here in one process and compared: dictionaries byte for byte (each
shard of W is the one-shard export split by ``bucket_of(key) % W``),
predictions exactly.
"""

import glob
import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tnrec as tn
from tests.multiprocess.conftest import torchrun
from tests.unit.export import sharded_scenarios as scenarios
from tests.unit.export.export_common import read_doc, split_shards
from tnrec.cli import export as cli_export
from tnrec.cli import main
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.distribute import current_strategy
from tnrec.errors import ArgumentError
from tnrec.serving import Predictor

DAYS = scenarios.DAYS
TOML = """\
seed = 3
output_dir = "out"
[model]
name = "widedeep"
embedding_dim = 4
hidden_units = [8]
[data]
dir = "data"
train_days = ["2024-05-10", "2024-05-11"]
test = "data/test/*.parquet"
shuffle = false
[train]
batch_size = 200
[eviction]
max_unseen_days = 1
"""
SCENARIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_scenarios.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The one-process references and what the 2 workers wrote, in one directory."""
    work = tmp_path_factory.mktemp("sharded")
    generate(work / "data", SyntheticConfig(rows_per_day=600, num_days=2, test_rows=200))
    (work / "run.toml").write_text(TOML)
    assert main(["train", "--config", str(work / "run.toml")]) == 0
    m1 = str(work / "out" / "model")
    res = torchrun(2, [str(work), m1], timeout_s=300.0, target=[SCENARIO])
    assert res.returncode == 0, res.stdout + res.stderr
    res = torchrun(
        2,
        ["export", "--model-dir", str(work / "m2"), "--out", str(work / "cli-from-w2")],
        timeout_s=300.0,
        target=["-m", "tnrec.cli"],
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("wrote the export to") == 1  # rank 0 prints
    had_strategy = current_strategy() is not None
    cli_export(m1, str(work / "ref"))
    cli_export(m1, str(work / "ref-d1"), dt=DAYS[0])
    cli_export(m1, str(work / "ref-delta"), delta=True, since=DAYS[0], to=DAYS[1])
    scenarios.two_tables(0, 1).export(str(work / "ref-two-tables"))
    if not had_strategy:  # the one-process strategy the command created
        current_strategy().shutdown()
    return work


@pytest.fixture(scope="module")
def raw(run):
    files = sorted(glob.glob(str(run / "data" / "test" / "*.parquet")))
    return pa.concat_tables(pq.read_table(f) for f in files)


def _same_dictionaries(got, want):
    doc = read_doc(want)
    assert sorted(read_doc(got)["tables"]) == sorted(doc["tables"])
    for table in doc["tables"]:
        k1, w1 = tn.export.load_dictionary(want, table)
        k2, w2 = tn.export.load_dictionary(got, table)
        np.testing.assert_array_equal(k2, k1, err_msg=table)
        np.testing.assert_array_equal(w2, w1, err_msg=table)


@pytest.mark.parametrize(
    "name",
    ["from-w1", "from-w2", "model-export", "cli-from-w2"],
    ids=["ckpt-of-1-worker", "ckpt-of-2-workers", "model.export", "torchrun-tnrec-export"],
)
def test_an_export_of_two_workers_equals_the_one_process_export(run, raw, name):
    got, want = str(run / name), str(run / "ref")
    doc = read_doc(got)
    assert doc["format_version"] == 3 and doc["routing"]["num_shards"] == 2
    assert read_doc(str(run / "m2" / DAYS[1] / "2"))["world_size"] == 2
    # every shard is byte for byte the one-process dictionary split by the routing rule
    split = split_shards(want, run / f"split-{name}", 2)
    shard_files = {k: v for k, v in doc["files"].items() if k.startswith("embeddings/")}
    assert shard_files == {
        k: v for k, v in read_doc(split)["files"].items() if k.startswith("embeddings/")
    }
    assert doc["tables"] == read_doc(split)["tables"]
    _same_dictionaries(got, want)
    np.testing.assert_array_equal(Predictor(got).predict(raw), Predictor(want).predict(raw))
    for table in doc["tables"]:  # every key of the dictionary, each from its shard
        keys, weights = tn.export.load_dictionary(want, table)
        np.testing.assert_array_equal(Predictor(got).lookup(table, np.asarray(keys)), weights)


def test_the_workers_export_only_their_own_keys(run):
    for r in range(2):
        out = json.loads((run / f"result-rank{r}.json").read_text())
        assert out["own_keys_only"] is True


def test_a_delta_of_two_workers_applied_to_either_export_gives_the_next_day(run):
    delta1, delta2, ref = (str(run / n) for n in ("delta-from-w1", "delta-from-w2", "ref-delta"))
    want_doc = read_doc(ref)
    for delta in (delta1, delta2):
        doc = read_doc(delta)
        assert doc["routing"]["num_shards"] == 2 and doc["format_version"] == 3
        for t, entry in doc["tables"].items():
            for c in ("updated", "deleted", "dim"):
                assert entry[c] == want_doc["tables"][t][c]
    assert want_doc["tables"]["emb"]["deleted"] > 0 and want_doc["tables"]["emb"]["updated"] > 0
    day1, day2 = str(run / "d1-from-w1"), str(run / "from-w1")  # sharded full exports
    one1, one2 = str(run / "ref-d1"), str(run / "ref")  # one shard
    for table in want_doc["tables"]:
        for r in range(2):  # shard by shard: the delta's shard r alone
            k, w = tn.export.apply_delta(
                *tn.export.load_shard(day1, table, r), delta2, table, shard=(r, 2)
            )
            k2, w2 = tn.export.load_shard(day2, table, r)
            np.testing.assert_array_equal(k, k2)
            np.testing.assert_array_equal(w, w2)
        want = tn.export.load_dictionary(one2, table)
        for delta, shard in ((delta1, None), (delta2, (0, 1)), (ref, None)):
            k, w = tn.export.apply_delta(
                *tn.export.load_dictionary(one1, table), delta, table, shard=shard
            )
            np.testing.assert_array_equal(k, want[0])
            np.testing.assert_array_equal(w, want[1])
        for r in range(2):  # a one-shard delta applied to shard r of 2: the part that routes there
            k, w = tn.export.apply_delta(
                *tn.export.load_shard(day1, table, r), ref, table, shard=(r, 2)
            )
            np.testing.assert_array_equal(k, tn.export.load_shard(day2, table, r)[0])


def test_an_empty_table_and_a_worker_without_keys(run):
    got, want = str(run / "two-tables"), str(run / "ref-two-tables")
    tables = read_doc(got)["tables"]
    n = tables["few"]["count"]
    assert n > 0
    assert tables["few"]["shards"] == [{"count": n}, {"count": 0}]  # rank 1 holds no key
    assert tables["none"] == {"dim": 2, "count": 0, "shards": [{"count": 0}, {"count": 0}]}
    _same_dictionaries(got, want)
    rows = scenarios.two_table_rows()
    np.testing.assert_array_equal(Predictor(got).predict(rows), Predictor(want).predict(rows))
    keys, weights = tn.export.load_shard(got, "none", 1)
    assert keys.shape == (0,) and weights.shape == (0, 2)


def test_a_write_that_fails_on_one_worker_fails_every_worker_and_leaves_nothing(run):
    r0, r1 = (json.loads((run / f"result-rank{r}.json").read_text())["failed"] for r in (0, 1))
    target = re.escape(str(run / "failed"))
    assert re.match(
        rf"Export {target} was not written \(nothing is left there\): Cannot write \S*"
        rf"{re.escape(scenarios.FAIL_NEEDLE)}: No space left on device",
        r1,
    ), r1
    assert re.match(
        rf"Export {target} was not written \(nothing is left there\): rank 1 of 2 failed to "
        r"write its shards \(WriteError; that worker's own error says why\)\.",
        r0,
    ), r0
    assert not [e for e in os.listdir(run) if "failed" in e]  # no export, no staging dir


def test_a_worker_reads_only_its_buckets_of_the_parts_that_hold_them(run, monkeypatch):
    from tnrec.table import files as table_files

    opened = []
    verify = table_files.verify

    def spy(path):
        opened.append(os.path.basename(path))
        return verify(path)

    monkeypatch.setattr(table_files, "verify", spy)
    for root, parts_read in (("out/model", ["part-00000-of-00001"]), ("m2", None)):
        ckpt = tn.checkpoint.latest(str(run / root), DAYS[1])
        whole = tn.export.checkpoint_rows(ckpt)
        for r in range(2):
            opened.clear()
            mine = tn.export.checkpoint_rows(ckpt, rank=r, world_size=2)
            # the part of another worker is not opened: part r of 2 only (or the one part)
            want = parts_read or [f"part-{r:05d}-of-00002"]
            assert sorted(set(opened)) == want
            for table, rows in whole.items():
                keep = tn.export.shard_of(rows["keys"], 2) == r
                for a in ("keys", "weights", "show", "marker"):
                    np.testing.assert_array_equal(mine[table][a], rows[a][keep])
    with pytest.raises(ArgumentError, match=r"`rank` must be an int in \[0, world_size\)"):
        tn.export.checkpoint_rows(ckpt, rank=2, world_size=2)


def test_apply_delta_shard_argument_errors(run):
    delta = str(run / "delta-from-w2")
    keys, weights = tn.export.load_shard(str(run / "d1-from-w1"), "emb", 0)
    with pytest.raises(ArgumentError, match=r"`shard` must be None or \(r, W\)"):
        tn.export.apply_delta(keys, weights, delta, "emb", shard=(2, 2))
    with pytest.raises(
        ArgumentError, match=r"`keys` holds key -?\d+ of shard 0 of 2, not of shard"
    ):
        tn.export.apply_delta(keys, weights, delta, "emb", shard=(1, 2))
