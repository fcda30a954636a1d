"""The Predictor on a sharded export: routing keys to shards, loading only some, bad shards.

The tiny export (one shard, written in one process) is split by the routing
rule into 3 shards (``export_common.split_shards``: what 3 workers write), so
every answer can be compared with the one-shard export's.
"""

import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pytest

import tnrec as tn
from tests.unit.export.export_common import (
    read_doc,
    replace_npy,
    split_shards,
    tiny_rows,
    unshard,
    write_doc,
)
from tnrec.errors import ArgumentError, CheckpointError, ChecksumError, TableKeyError
from tnrec.serving import Predictor

W = 3


def shard_rel(r, f="keys.npy"):
    return f"embeddings/emb/shard-{r:05d}-of-{W:05d}/{f}"


@pytest.fixture(scope="module")
def sharded(tiny_export, tmp_path_factory):
    return split_shards(tiny_export, tmp_path_factory.mktemp("sharded") / "exp", W)


@pytest.fixture
def copy(sharded, tmp_path):
    """A fresh copy of the sharded export, free to damage."""
    return shutil.copytree(sharded, str(tmp_path / "exp"))


@pytest.fixture(scope="module")
def rows():
    return [{k: v for k, v in r.items() if k != "y"} for r in tiny_rows(40, 9)]


@pytest.fixture(scope="module")
def keys(tiny_export):
    """Every key of the dictionary, and as many keys that are not in it."""
    known, _ = tn.export.load_dictionary(tiny_export, "emb")
    unknown = np.arange(10**6, 10**6 + known.shape[0], dtype=np.int64)
    return np.concatenate([np.asarray(known), unknown])


def test_every_shard_holds_its_keys_and_the_predictor_equals_the_one_shard_export(
    tiny_export, sharded, rows, keys
):
    one, many = Predictor(tiny_export), Predictor(sharded)
    assert (one.num_shards, one.shards) == (1, (0,))
    assert (many.num_shards, many.shards) == (W, (0, 1, 2))
    counts = [s["count"] for s in many.manifest["tables"]["emb"]["shards"]]
    assert sum(counts) == 18 and min(counts) > 0  # every shard holds some of the 18 keys
    for r in range(W):
        k, _ = tn.export.load_shard(sharded, "emb", r)
        assert isinstance(k, np.memmap) and (tn.export.shard_of(np.asarray(k), W) == r).all()
    np.testing.assert_array_equal(many.lookup("emb", keys), one.lookup("emb", keys))
    assert not many.lookup("emb", keys[18:]).any()  # unknown keys read as zeros
    np.testing.assert_array_equal(many.predict(rows), one.predict(rows))
    k1, w1 = tn.export.load_dictionary(tiny_export, "emb")
    k3, w3 = tn.export.load_dictionary(sharded, "emb")  # the shards merged, in key order
    np.testing.assert_array_equal(k3, k1)
    np.testing.assert_array_equal(w3, w1)


def test_a_predictor_of_some_shards_serves_their_keys_and_refuses_the_others(
    tiny_export, sharded, rows, keys
):
    one, part = Predictor(tiny_export), Predictor(sharded, shards=[2, 0])
    assert part.shards == (0, 2) and sorted(part.dictionaries["emb"]) == [0, 2]
    owner = tn.export.shard_of(keys, W)
    mine = keys[owner != 1]
    np.testing.assert_array_equal(part.lookup("emb", mine), one.lookup("emb", mine))
    other = keys[owner == 1]
    with pytest.raises(
        TableKeyError,
        match=rf'table "emb": key {other[0]} \(and {other.shape[0] - 1} more\) is in shard 1 '
        r"of 3, which this Predictor did not load \(shards=\[0, 2\]\)",
    ):
        part.lookup("emb", keys)
    # rows whose keys all lie in the loaded shards predict as the whole export does
    batch = tn.data.to_batch(pa.Table.from_pylist(rows), one.columns)
    ok = np.ones(len(rows), bool)
    for jagged in batch.sparse.values():
        row_of = np.repeat(np.arange(len(rows)), np.diff(jagged.offsets))  # [N]
        ok[row_of[tn.export.shard_of(jagged.keys, W) == 1]] = False
    served = [r for r, keep in zip(rows, ok, strict=True) if keep]
    assert 0 < len(served) < len(rows)
    np.testing.assert_array_equal(part.predict(served), one.predict(served))
    with pytest.raises(TableKeyError, match=r"is in shard 1 of 3, which this Predictor did not"):
        part.predict(rows)


def test_only_the_loaded_shards_are_read(copy):
    for f in ("keys.npy", "weights.npy"):
        os.remove(os.path.join(copy, shard_rel(1, f)))
    Predictor(copy, shards=[0, 2])  # neither verified nor opened
    missing = re.escape(shard_rel(1))
    with pytest.raises(CheckpointError, match=rf"Export file .*{missing} is missing"):
        Predictor(copy)
    with pytest.raises(CheckpointError, match=rf"Export file .*{missing} is missing"):
        Predictor(copy, verify=False, shards=[1])


@pytest.mark.parametrize(
    "shards",
    [
        pytest.param([], id="empty"),
        pytest.param([3], id="out-of-range"),
        pytest.param([-1], id="negative"),
        pytest.param([0, 0], id="repeated"),
        pytest.param("0", id="a-str"),
        pytest.param(0, id="an-int"),
        pytest.param([True], id="a-bool"),
        pytest.param([0.0], id="a-float"),
    ],
)
def test_bad_shards_argument(sharded, shards):
    with pytest.raises(
        ArgumentError,
        match=r"Predictor: `shards` must be a non-empty list of distinct shard indices in "
        rf"\[0, 3\) \(export .* has 3 shard\(s\)\)\. Received: {re.escape(repr(shards))}\.",
    ):
        Predictor(sharded, shards=shards)


@pytest.mark.parametrize(
    ("shard", "match"),
    [
        pytest.param(3, r"shard 3 is not one of the export's 3 shards \(0 to 2\)", id="3"),
        pytest.param(-1, r"shard -1 is not one of the export's 3 shards", id="negative"),
        pytest.param("0", r"a shard must be an int\. Received: '0'", id="a-str"),
    ],
)
def test_load_shard_argument_errors(sharded, shard, match):
    with pytest.raises(ArgumentError, match=r"Export .*, table 'emb': " + match):
        tn.export.load_shard(sharded, "emb", shard)


def test_lookup_argument_errors(sharded):
    p = Predictor(sharded)
    with pytest.raises(ArgumentError, match=r"has no table 'nope'; it has \['emb'\]"):
        p.lookup("nope", np.zeros(1, np.int64))
    with pytest.raises(ArgumentError, match=r"`keys` must be int64\[N\]\. Received: int32\[2\]"):
        p.lookup("emb", np.zeros(2, np.int32))


@pytest.mark.parametrize(
    "rel", [shard_rel(1), shard_rel(2, "weights.npy")], ids=["keys-1", "weights-2"]
)
def test_a_damaged_shard_file_is_named(copy, rel):
    fname = os.path.join(copy, rel)
    with open(fname, "r+b") as f:
        f.truncate(os.path.getsize(fname) // 2)
    name = re.escape(rel)
    with pytest.raises(ChecksumError, match=rf"{name} is corrupt: its sha256 does not match"):
        Predictor(copy)
    with pytest.raises(CheckpointError, match=rf"{name} is damaged \(not a readable \.npy"):
        Predictor(copy, verify=False)


def test_keys_in_the_wrong_shard_are_refused_naming_the_file(copy):
    k0, k1 = (np.load(os.path.join(copy, shard_rel(r))) for r in (0, 1))
    n = min(k0.shape[0], k1.shape[0])
    # a consistent forgery (sha256 recomputed): shard 1 holds shard 0's keys, as many as before
    swapped = np.sort(np.concatenate([k0[:n], k1[n:]]))
    replace_npy(copy, shard_rel(1), swapped)
    with pytest.raises(
        CheckpointError,
        match=rf"{re.escape(shard_rel(1))}: key {k0[0]} at position \d+ belongs to shard 0 of 3, "
        r"not to this shard 1",
    ):
        Predictor(copy)


def test_counts_of_the_shards_must_sum_to_the_table(copy):
    doc = read_doc(copy)
    doc["tables"]["emb"]["shards"][0]["count"] += 1
    write_doc(copy, doc)
    with pytest.raises(
        CheckpointError, match=r"tables\['emb'\]: field 'count' must be 19 \(the sum over its"
    ):
        Predictor(copy)
    doc["tables"]["emb"]["count"] += 1
    write_doc(copy, doc)
    with pytest.raises(CheckpointError, match=rf"{re.escape(shard_rel(0))} holds \d+ keys; "):
        Predictor(copy)


def _edit(path, value):
    def edit(doc):
        *parents, last = path
        for p in parents:
            doc = doc[p]
        if value is KeyError:
            del doc[last]
        else:
            doc[last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        pytest.param(
            _edit(["routing", "rule"], "key % num_shards"),
            r"routing: field 'rule' must be 'bucket_of\(key\) % num_shards'\. "
            r"Received: 'key % num_shards'",
            id="rule",
        ),
        pytest.param(
            _edit(["routing", "num_buckets"], 512),
            r"routing: field 'num_buckets' must be 1024\. Received: 512",
            id="num-buckets",
        ),
        pytest.param(
            _edit(["routing", "num_shards"], 2),
            r"tables\['emb'\]: field 'shards' must be a list of 2 objects",
            id="num-shards",
        ),
        pytest.param(
            _edit(["routing", "num_shards"], 0),
            r"routing: field 'num_shards' must be an int >= 1\. Received: 0",
            id="no-shards",
        ),
        pytest.param(_edit(["routing"], KeyError), r"field 'routing' is missing", id="routing"),
        pytest.param(
            _edit(["tables", "emb", "shards", 1], 5),
            r"tables\['emb'\]: shards\[1\] must be a JSON object\. Received: 5",
            id="shard-entry",
        ),
        pytest.param(
            _edit(["files", shard_rel(2)], KeyError),
            rf"field 'files' lacks \['{re.escape(shard_rel(2))}'\]",
            id="files-lack-a-shard",
        ),
    ],
)
def test_the_routing_and_shards_of_the_manifest_are_checked(copy, edit, match):
    doc = read_doc(copy)
    edit(doc)
    write_doc(copy, doc)  # a valid checksum: only the schema check refuses it
    with pytest.raises(CheckpointError, match=r"export manifest .*manifest\.json: " + match):
        Predictor(copy)


def test_version_2_and_3_exports_of_one_shard_read_alike(tiny_export, tmp_path, rows, keys):
    v2 = shutil.copytree(tiny_export, str(tmp_path / "v2"))
    unshard(v2)
    assert read_doc(v2)["format_version"] == 2
    assert os.path.isfile(os.path.join(v2, "embeddings", "emb", "keys.npy"))
    old, new = Predictor(v2), Predictor(tiny_export)
    assert old.manifest["routing"] == new.manifest["routing"]
    assert old.manifest["tables"] == new.manifest["tables"]
    np.testing.assert_array_equal(old.predict(rows), new.predict(rows))
    np.testing.assert_array_equal(old.lookup("emb", keys), new.lookup("emb", keys))
    with pytest.raises(ArgumentError, match=r"shard indices in \[0, 1\)"):
        Predictor(v2, shards=[1])
