"""What an export's readers check: the manifest's checksum and schema, the dictionaries' order
and shapes, provenance, legacy version-1 exports, and that a failed write leaves nothing."""

import os
import re
import shutil

import numpy as np
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import (
    Tiny,
    read_doc,
    replace_npy,
    tiny_batches,
    tiny_rows,
    to_legacy,
    write_doc,
)
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    ChecksumError,
    FormatVersionError,
    WriteError,
)
from tnrec.export import apply_delta, export, export_delta, load_dictionary, read_manifest
from tnrec.serving import Predictor

SHARD = "embeddings/emb/shard-00000-of-00001"
KEYS, WEIGHTS = f"{SHARD}/keys.npy", f"{SHARD}/weights.npy"


@pytest.fixture(scope="module")
def rows():
    return tiny_rows(24, 7)


@pytest.fixture(scope="module")
def want(tiny_export, rows):
    return Predictor(tiny_export).predict(rows)


# ---------------------------------------------------------------- the manifest's checksum


def test_manifest_has_version_3_a_checksum_and_provenance(tiny, tiny_export):
    doc = read_doc(tiny_export)
    assert doc["format_version"] == 3 and re.fullmatch(r"sha256:[0-9a-f]{64}", doc["checksum"])
    assert doc["provenance"] == {
        "model_dir": None,
        "dt": "d1",
        "generation": None,
        "global_step": tiny.global_step,
        "complete": None,
    }
    assert "checksum" not in read_manifest(tiny_export)


def _swap_columns(doc):
    a, b = doc["inputs"][0], doc["inputs"][1]
    a["column"], b["column"] = b["column"], a["column"]


def _head_prediction(doc):
    doc["heads"][0]["prediction"] = "identity"


def _default_one(doc):
    (x,) = [c for c in doc["feature_spec"]["columns"] if c["key"] == "x"]
    x["default"] = 1.0


SILENT_EDITS = [
    pytest.param(_swap_columns, id="swap-two-inputs-columns"),
    pytest.param(_head_prediction, id="head-prediction"),
    pytest.param(_default_one, id="numeric-default-0-to-1"),
]


@pytest.mark.parametrize("edit", SILENT_EDITS)
def test_an_edited_manifest_is_refused(exp, rows, want, edit):
    doc = read_doc(exp)
    edit(doc)
    write_doc(exp, doc, checksum=False)  # the old checksum stays
    with pytest.raises(
        ChecksumError,
        match=r"export manifest .*exp/manifest\.json is corrupt: its content does not match "
        r"its checksum",
    ):
        Predictor(exp)
    # the same edit with a recomputed checksum loads and predicts differently: the edit matters
    write_doc(exp, doc)
    assert not np.array_equal(Predictor(exp).predict(rows), want)


def test_a_version_2_manifest_without_its_checksum_is_not_read_as_version_1(exp):
    doc = read_doc(exp)
    del doc["checksum"]
    write_doc(exp, doc, checksum=False)
    with pytest.raises(ChecksumError, match=r"manifest\.json is corrupt"):
        Predictor(exp)


def test_legacy_version_1_export_still_loads(exp, rows, want):
    to_legacy(exp)
    p = Predictor(exp)
    assert p.manifest["format_version"] == 1 and p.manifest["provenance"] is None
    np.testing.assert_array_equal(p.predict(rows), want)


def test_legacy_version_1_fields_are_checked_too(exp):
    to_legacy(exp)
    doc = read_doc(exp)
    doc["heads"][0]["prediction"] = "softmax"
    write_doc(exp, doc, checksum=False)
    with pytest.raises(CheckpointError, match=r"heads\[0\]: field 'prediction' must be one of"):
        Predictor(exp)


# ---------------------------------------------------------------- the manifest's schema


def _set(path, value):
    def edit(doc):
        *parents, last = path
        for p in parents:
            doc = doc[p]
        if value is KeyError:
            del doc[last]
        else:
            doc[last] = value

    return edit


SCHEMA = [
    pytest.param(
        _set(["heads", 0, "prediction"], "softmax"),
        r"heads\[0\]: field 'prediction' must be one of \['identity', 'sigmoid'\]\. "
        r"Received: 'softmax'",
        id="prediction",
    ),
    pytest.param(_set(["heads"], []), r"field 'heads' must be a non-empty list", id="heads-empty"),
    pytest.param(
        _set(["heads"], {"ctr": "sigmoid"}), r"field 'heads' must be list", id="heads-a-dict"
    ),
    pytest.param(
        _set(["heads", 0, "name"], KeyError),
        r"heads\[0\]: field 'name' is missing",
        id="head-name-missing",
    ),
    pytest.param(
        _set(["inputs", 0, "dim"], 5),
        r"inputs\[0\]: field 'dim' must be 4 \(its table's dim\)\. Received: 5",
        id="input-dim",
    ),
    pytest.param(
        _set(["inputs", 1, "table"], "nope"),
        r"inputs\[1\]: field 'table' must be one of the tables \['emb'\]\. Received: 'nope'",
        id="input-table",
    ),
    pytest.param(
        _set(["inputs", 0, "column"], "x"),
        r"inputs\[0\]: field 'column' must be a categorical column of feature_spec",
        id="input-column-numeric",
    ),
    pytest.param(
        _set(["inputs", 0, "column"], "v"),
        r"inputs\[0\]: field 'column' must be a categorical column of feature_spec\. "
        r"Received: 'v'",
        id="input-column-unknown",
    ),
    pytest.param(
        _set(["inputs", 0, "sequence"], True),
        r"inputs\[0\]: field 'sequence' must be False \(as feature_spec declares it\)",
        id="input-sequence",
    ),
    pytest.param(
        _set(["inputs", 0, "combiner"], "max"),
        r"inputs\[0\]: field 'combiner' must be one of \['sum', 'mean', 'sqrtn'\]",
        id="input-combiner",
    ),
    pytest.param(
        _set(["inputs", 0, "output"], "stack"),
        r"inputs\[0\]: field 'output' must be one of",
        id="input-output",
    ),
    pytest.param(
        _set(["inputs", 0, "dim"], True),
        r"inputs\[0\]: field 'dim' must be int\. Received: True",
        id="input-dim-bool",
    ),
    pytest.param(
        _set(["num_dense"], 2),
        r"field 'num_dense' must be 1 \(the numeric columns of feature_spec\)\. Received: 2",
        id="num-dense",
    ),
    pytest.param(
        _set(["feature_spec", "hash"], "md5"),
        r"field 'feature_spec' is invalid: feature spec: unsupported `hash` 'md5'",
        id="feature-spec",
    ),
    pytest.param(
        _set(["tables", "emb", "count"], -1),
        r"tables\['emb'\]: field 'count' must be an int >= 0\. Received: -1",
        id="table-count",
    ),
    pytest.param(
        lambda d: d["tables"].update({"../x": {"dim": 4, "count": 0}}),
        r"table '\.\./x' is not a relative path inside the export",
        id="table-name",
    ),
    pytest.param(
        _set(["files", "dense.pt2"], KeyError),
        r"field 'files' lacks \['dense\.pt2'\]",
        id="files-lack-graph",
    ),
    pytest.param(
        lambda d: d["files"].update({"/etc/passwd": "0" * 64}),
        r"file '/etc/passwd' is not a relative path inside the export",
        id="files-outside",
    ),
    pytest.param(
        _set(["files", "dense.pt2"], "abc"),
        r"files: field 'dense\.pt2' must be a sha256 \(64 hex digits\)\. Received: 'abc'",
        id="files-digest",
    ),
    pytest.param(
        _set(["min_show"], "2"), r"field 'min_show' must be int or float or NoneType", id="min-show"
    ),
    pytest.param(
        _set(["dt"], 20240510), r"field 'dt' must be str or NoneType\. Received: 20240510", id="dt"
    ),
    pytest.param(
        _set(["provenance"], KeyError), r"field 'provenance' is missing", id="provenance-missing"
    ),
    pytest.param(
        _set(["provenance", "generation"], "3"),
        r"provenance: field 'generation' must be int or NoneType\. Received: '3'",
        id="provenance-generation",
    ),
    pytest.param(
        _set(["provenance", "global_step"], -1),
        r"provenance: field 'global_step' must be an int >= 0 or null",
        id="provenance-step",
    ),
    pytest.param(
        _set(["provenance", "complete"], "yes"),
        r"provenance: field 'complete' must be bool or NoneType",
        id="provenance-complete",
    ),
    pytest.param(
        _set(["provenance", "host"], "a"),
        r"provenance: unknown fields \['host'\]",
        id="provenance-unknown",
    ),
    pytest.param(
        _set(["onnx"], {"file": "dense.onnx"}), r"onnx: field 'inputs' is missing", id="onnx"
    ),
]


@pytest.mark.parametrize(("edit", "match"), SCHEMA)
def test_schema_errors_name_the_file_and_the_field(exp, edit, match):
    doc = read_doc(exp)
    edit(doc)
    write_doc(exp, doc)  # a valid checksum: only the schema check can refuse it
    with pytest.raises(CheckpointError, match=r"export manifest .*exp/manifest\.json: .*" + match):
        Predictor(exp)


@pytest.mark.parametrize(
    ("edit", "exc", "match"),
    [
        pytest.param(
            _set(["format_version"], 4),
            FormatVersionError,
            r"manifest\.json: format_version 4 is not supported \(this tnrec reads 2, 3\)",
            id="version-4",
        ),
        pytest.param(
            _set(["format"], "tnrec.checkpoint"),
            CheckpointError,
            r"manifest\.json is damaged or not a tnrec\.export document",
            id="other-format",
        ),
    ],
)
def test_format_and_version(exp, edit, exc, match):
    doc = read_doc(exp)
    edit(doc)
    write_doc(exp, doc)
    with pytest.raises(exc, match=match):
        Predictor(exp)


def test_damaged_manifest_json(exp):
    with open(os.path.join(exp, "manifest.json"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match=r"manifest\.json is damaged \(not valid JSON"):
        Predictor(exp)


# ---------------------------------------------------------------- the dictionaries


def _keys(exp):
    return np.load(os.path.join(exp, KEYS))


def _weights(exp):
    return np.load(os.path.join(exp, WEIGHTS))


DICTIONARIES = [
    pytest.param(
        KEYS,
        lambda e: _keys(e)[::-1].copy(),
        r"keys\.npy: keys must be strictly increasing \(sorted, unique\); position 1 holds",
        id="keys-reversed",
    ),
    pytest.param(
        KEYS,
        lambda e: np.concatenate([_keys(e)[:1], _keys(e)[:-1]]),
        r"keys\.npy: keys must be strictly increasing \(sorted, unique\); position 1 holds",
        id="keys-repeated",
    ),
    pytest.param(
        KEYS,
        lambda e: _keys(e).astype(np.int32),
        r"keys\.npy: keys must be int64\[n\]\. Received: int32\[18\]",
        id="keys-int32",
    ),
    pytest.param(
        KEYS,
        lambda e: _keys(e).reshape(2, -1),
        r"keys\.npy: keys must be int64\[n\]\. Received: int64\[2, 9\]",
        id="keys-2d",
    ),
    pytest.param(
        KEYS,
        lambda e: _keys(e)[:-1],
        r"keys\.npy holds 17 keys; manifest\.json says 18",
        id="keys-count",
    ),
    pytest.param(
        WEIGHTS,
        lambda e: _weights(e).astype(np.float64),
        r"weights\.npy: weights must be float32\[18, 4\] .* Received: float64\[18, 4\]",
        id="weights-float64",
    ),
    pytest.param(
        WEIGHTS,
        lambda e: _weights(e)[:, :3].copy(),
        r"weights\.npy: weights must be float32\[18, 4\] .* Received: float32\[18, 3\]",
        id="weights-dim",
    ),
    pytest.param(
        WEIGHTS,
        lambda e: _weights(e)[:-1],
        r"weights\.npy: weights must be float32\[18, 4\] .* Received: float32\[17, 4\]",
        id="weights-rows",
    ),
]


@pytest.mark.parametrize(("rel", "make", "match"), DICTIONARIES)
def test_dictionary_checks_with_a_recomputed_sha(exp, rel, make, match):
    assert _keys(exp).shape == (18,)  # the messages below count on it
    replace_npy(exp, rel, make(exp))
    with pytest.raises(CheckpointError, match=match):
        Predictor(exp)
    with pytest.raises(CheckpointError, match=match):
        load_dictionary(exp, "emb")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:40], id="truncated-header"),
        pytest.param(lambda b: b"garbage" * 10, id="garbage"),
    ],
)
@pytest.mark.parametrize("rel", [KEYS, WEIGHTS])
def test_damaged_npy_is_a_checkpoint_error_naming_it(exp, rel, damage):
    fname = os.path.join(exp, rel)
    with open(fname, "rb") as f:
        data = f.read()
    with open(fname, "wb") as f:
        f.write(damage(data))
    name = re.escape(rel)
    with pytest.raises(ChecksumError, match=rf"{name} is corrupt: its sha256 does not match"):
        Predictor(exp)
    with pytest.raises(CheckpointError, match=rf"{name} is damaged \(not a readable \.npy array"):
        Predictor(exp, verify=False)
    with pytest.raises(CheckpointError, match=rf"{name} is damaged"):
        load_dictionary(exp, "emb")


def test_missing_dictionary_file(exp):
    os.remove(os.path.join(exp, WEIGHTS))
    for verify in (True, False):
        with pytest.raises(CheckpointError, match=r"Export file .*weights\.npy is missing"):
            Predictor(exp, verify=verify)
    with pytest.raises(ArgumentError, match=r"has no table 'nope'; it has \['emb'\]"):
        load_dictionary(exp, "nope")


def test_damaged_or_missing_graph(exp):
    graph = os.path.join(exp, "dense.pt2")
    shutil.copy(os.path.join(exp, KEYS), graph)
    with pytest.raises(ChecksumError, match=r"dense\.pt2 is corrupt"):
        Predictor(exp)
    with pytest.raises(CheckpointError, match=r"dense\.pt2 is damaged \(torch\.export\.load fails"):
        Predictor(exp, verify=False)
    os.remove(graph)
    with pytest.raises(CheckpointError, match=r"Export file .*dense\.pt2 is missing"):
        Predictor(exp, verify=False)


def test_a_zip_in_place_of_a_dictionary(exp, tiny_export):
    shutil.copy(os.path.join(tiny_export, "dense.pt2"), os.path.join(exp, KEYS))
    with pytest.raises(
        CheckpointError, match=r"keys\.npy is damaged \(a zip archive, not an \.npy"
    ):
        Predictor(exp, verify=False)


# ---------------------------------------------------------------- provenance


def test_provenance_is_recorded_and_read_back(tiny, tmp_path):
    prov = {
        "model_dir": "/runs/m",
        "dt": "2024-05-12",
        "generation": 7,
        "global_step": 1234,
        "complete": True,
    }
    path = tiny.export(str(tmp_path / "e"), dt="2024-05-12", provenance=prov)
    assert read_doc(path)["provenance"] == prov
    assert Predictor(path).manifest["provenance"] == prov
    part = export(tiny, str(tmp_path / "p"), provenance={"model_dir": "/runs/m", "generation": 7})
    assert read_manifest(part)["provenance"] == {
        "model_dir": "/runs/m",
        "dt": None,
        "generation": 7,
        "global_step": None,
        "complete": None,
    }


@pytest.mark.parametrize(
    ("prov", "match"),
    [
        pytest.param({"gen": 1}, r"`provenance` has unknown keys \['gen'\]", id="unknown"),
        pytest.param(
            {"generation": "3"},
            r"`provenance`: field 'generation' must be int or NoneType\. Received: '3'",
            id="generation-str",
        ),
        pytest.param(
            {"global_step": -1},
            r"`provenance`: field 'global_step' must be an int >= 0 or null",
            id="neg",
        ),
        pytest.param(
            {"complete": 1},
            r"`provenance`: field 'complete' must be bool or NoneType",
            id="complete-int",
        ),
        pytest.param(("a", 1), r"`provenance` must be a dict with keys", id="not-a-dict"),
    ],
)
def test_bad_provenance_is_an_argument_error(tiny, tmp_path, prov, match):
    with pytest.raises(ArgumentError, match=r"export: " + match):
        tiny.export(str(tmp_path / "e"), provenance=prov)
    assert not os.path.exists(tmp_path / "e")


# ---------------------------------------------------------------- export's arguments


def test_export_argument_errors(tiny, tmp_path):
    out = str(tmp_path / "e")
    rows = tiny.tables["emb"].rows()
    with pytest.raises(ArgumentError, match=r"`min_show` must be a number or None\. Received: '2'"):
        tiny.export(out, min_show="2")
    with pytest.raises(ArgumentError, match=r"`tables\['emb'\]` lacks \['show'\]"):
        export(
            tiny,
            out,
            min_show=1.0,
            tables={"emb": {"keys": rows["keys"], "weights": rows["weights"]}},
        )
    twice = {
        "keys": np.repeat(rows["keys"][:2], 2),
        "weights": np.repeat(rows["weights"][:2], 2, 0),
    }
    with pytest.raises(ArgumentError, match=r"`tables\['emb'\]`: keys must be unique"):
        export(tiny, out, tables={"emb": twice})
    f64 = {"keys": rows["keys"], "weights": rows["weights"].astype(np.float64)}
    with pytest.raises(
        ArgumentError, match=r"weights must be float32\[18, D\]\. Received: float64"
    ):
        export(tiny, out, tables={"emb": f64})
    with pytest.raises(
        ArgumentError, match=r"a table name must be a file name\. Received: '\.\./x'"
    ):
        export(tiny, out, tables={"../x": rows})
    assert os.listdir(tmp_path) == []


class TwoOutputs(Tiny):
    def forward_dense(self, pooled, dense):
        z = self.mlp(torch.cat([pooled["emb"], dense], 1))
        return {"a": z, "b": -z}


def test_heads_of_forward_dense_and_compile_must_agree(tmp_path):
    m = TwoOutputs()
    m.compile(tn.optimizer.Adam(0.01), loss="mse")
    with pytest.raises(
        ArgumentError,
        match=r"TwoOutputs\.forward_dense returned \['a', 'b'\], but the export needs one tensor "
        r"\(the heads of compile\(\); compile with one loss per head\)",
    ):
        m.export(str(tmp_path / "a"))
    m = Tiny()
    m.compile(tn.optimizer.Adam(0.01), loss={"a": "mse", "b": "mse"})
    with pytest.raises(
        ArgumentError, match=r"returned one tensor, but the export needs \['a', 'b'\]"
    ):
        m.export(str(tmp_path / "b"))
    m = TwoOutputs()
    m.compile(tn.optimizer.Adam(0.01), loss={"a": "mse", "b": "binary_crossentropy_from_logits"})
    got = Predictor(m.export(str(tmp_path / "c"))).predict(tiny_rows(3, 0))
    assert sorted(got) == ["a", "b"] and got["a"].shape == (3,)
    assert sorted(os.listdir(tmp_path)) == ["c"]


# ---------------------------------------------------------------- failed writes


@pytest.mark.parametrize("needle", ["keys.npy", "weights.npy", "dense.pt2", "manifest.json", None])
def test_a_failed_write_leaves_no_export(tiny, tmp_path, monkeypatch, needle):
    out = str(tmp_path / "e")
    monkeypatch.setenv("TNREC_FAIL_WRITE", needle or out)  # None: the final rename
    failed = re.escape(needle) if needle else re.escape(out)
    with pytest.raises(
        WriteError,
        match=rf"^Export {re.escape(out)} was not written \(nothing is left there\): "
        rf"Cannot write .*{failed}: No space left on device",
    ):
        tiny.export(out)
    assert os.listdir(tmp_path) == []  # neither the export nor its temporary directory


# ---------------------------------------------------------------- delta exports


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    torch.manual_seed(0)
    m = Tiny()
    m.compile(tn.optimizer.Adam(learning_rate=0.05), loss="binary_crossentropy_from_logits")
    root = tmp_path_factory.mktemp("ckpt")
    m.fit(tiny_batches(tiny_rows(48, 0)), verbose=0)
    g1 = m.save_weights(str(root / "m"), "d1")
    m.fit(tiny_batches(tiny_rows(48, 5)), verbose=0)
    g2 = m.save_weights(str(root / "m"), "d2")
    return g1, g2, str(root)


@pytest.fixture
def delta(checkpoints, tmp_path):
    g1, g2, _ = checkpoints
    return export_delta(g1, g2, str(tmp_path / "delta"))


def _old_rows(checkpoints):
    rows = tn.export.checkpoint_rows(checkpoints[0])["emb"]
    return rows["keys"], rows["weights"]


def test_delta_manifest_and_legacy_delta(checkpoints, delta):
    doc = read_doc(delta)
    assert doc["format_version"] == 3 and doc["checksum"].startswith("sha256:")
    assert (doc["since"], doc["to"], doc["since_generation"], doc["to_generation"]) == (
        "d1/1",
        "d2/2",
        1,
        2,
    )
    keys, weights = _old_rows(checkpoints)
    k, w = apply_delta(keys, weights, delta, "emb")
    new = tn.export.checkpoint_rows(checkpoints[1])["emb"]
    np.testing.assert_array_equal(k, new["keys"])
    to_legacy(delta)
    k1, w1 = apply_delta(keys, weights, delta, "emb")
    np.testing.assert_array_equal(k1, k) and np.testing.assert_array_equal(w1, w)


def test_delta_checks(checkpoints, delta):
    keys, weights = _old_rows(checkpoints)
    with pytest.raises(ArgumentError, match=r"has no table 'nope'; it has \['emb'\]"):
        apply_delta(keys, weights, delta, "nope")
    with pytest.raises(
        ArgumentError, match=r"must be int64\[n\] and float32\[n, 4\] .* float32\[\d+, 3\]"
    ):
        apply_delta(keys, weights[:, :3], delta, "emb")
    doc = read_doc(delta)
    doc["tables"]["emb"]["updated"] += 1
    write_doc(delta, doc, checksum=False)
    with pytest.raises(ChecksumError, match=r"delta export manifest .*manifest\.json is corrupt"):
        apply_delta(keys, weights, delta, "emb")
    write_doc(delta, doc)
    with pytest.raises(
        CheckpointError, match=r"tables\['emb'\]: field 'updated' must be \d+ \(the sum over"
    ):
        apply_delta(keys, weights, delta, "emb")
    doc["tables"]["emb"]["shards"][0]["updated"] += 1
    write_doc(delta, doc)
    with pytest.raises(CheckpointError, match=r"keys\.npy holds \d+ keys; manifest\.json says"):
        apply_delta(keys, weights, delta, "emb")
    doc["tables"]["emb"]["updated"] -= 1
    doc["tables"]["emb"]["shards"][0]["updated"] -= 1
    write_doc(delta, doc)
    upd = np.load(os.path.join(delta, KEYS))
    assert upd.shape[0] > 1
    replace_npy(delta, KEYS, upd[::-1].copy())
    with pytest.raises(CheckpointError, match=r"keys\.npy: keys must be strictly increasing"):
        apply_delta(keys, weights, delta, "emb")
    with pytest.raises(CheckpointError, match=r"not a tnrec\.export document|is damaged or not"):
        Predictor(delta)


def test_a_failed_delta_write_leaves_nothing(checkpoints, tmp_path, monkeypatch):
    g1, g2, _ = checkpoints
    out = str(tmp_path / "delta")
    monkeypatch.setenv("TNREC_FAIL_WRITE", "deleted.npy")
    with pytest.raises(WriteError, match=rf"^Export {re.escape(out)} was not written .*deleted"):
        export_delta(g1, g2, out)
    assert os.listdir(tmp_path) == []
