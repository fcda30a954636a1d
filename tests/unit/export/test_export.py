"""Export -> Predictor reproduces model.predict from raw rows; delta exports; the graph alone."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

import tnrec as tn
from tests.unit.export.export_common import Custom, batches, raw_rows, schema, train_custom
from tnrec.errors import ArgumentError, ChecksumError, DataError
from tnrec.export import apply_delta, export_delta, load_dictionary
from tnrec.serving import Predictor


@pytest.fixture(scope="module")
def trained():
    return train_custom()


def test_predictor_reproduces_model_predict_from_raw_rows(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    manifest = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert [h["name"] for h in manifest["heads"]] == ["ctr", "cvr"]
    keys, weights = load_dictionary(path, "emb")
    assert isinstance(keys, np.memmap) and (np.diff(keys) > 0).all() and weights.shape[1] == 4
    rows = raw_rows(96, 1)  # new rows: unseen keys, missing values, multi-valued, sequences
    want = trained.predict(batches(rows))
    got = Predictor(path).predict(rows)
    for head in ("ctr", "cvr"):
        np.testing.assert_allclose(got[head], want[f"prediction_{head}"], rtol=1e-5, atol=1e-6)
    # the other input forms give the same answer
    table = pa.Table.from_pylist(rows, schema=schema())
    np.testing.assert_array_equal(Predictor(path).predict(table)["ctr"], got["ctr"])
    np.testing.assert_array_equal(Predictor(path).predict(table.to_pydict())["ctr"], got["ctr"])


def test_predictor_in_a_fresh_process(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    rows = raw_rows(20, 2)
    want = trained.predict(batches(rows))["prediction_ctr"]
    code = (
        "import json, sys, numpy as np\n"
        "from tnrec.serving import Predictor\n"
        "rows = json.loads(sys.stdin.read())\n"
        f"print(json.dumps(Predictor({path!r}).predict(rows)['ctr'].tolist()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(rows), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(json.loads(out.stdout), want, rtol=1e-5, atol=1e-6)


def test_dense_graph_runs_in_a_process_that_imports_only_torch(trained, tmp_path):
    path = trained.export(str(tmp_path / "exp"))
    code = (
        "import sys, torch\n"
        f"g = torch.export.load({os.path.join(path, 'dense.pt2')!r}).module()\n"
        "B = 5\n"
        "args = [torch.randn(B, 4) for _ in range(4)]\n"
        "args += [torch.randn(B, 3, 4), torch.tensor([0, 1, 2, 3, 3]), torch.randn(B, 1)]\n"
        "ctr, cvr = g(*args)\n"
        "assert ctr.shape == (B,) and cvr.shape == (B,)\n"
        "print(sorted(m for m in sys.modules if m.startswith('tnrec')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_min_show_prunes_and_pruned_keys_read_as_zeros(trained, tmp_path):
    full = Predictor(trained.export(str(tmp_path / "full")))
    pruned_path = trained.export(str(tmp_path / "pruned"), min_show=1e9)
    keys, _ = load_dictionary(pruned_path, "emb")
    assert keys.shape[0] == 0
    rows = raw_rows(10, 3)
    assert not np.allclose(full.predict(rows)["ctr"], Predictor(pruned_path).predict(rows)["ctr"])


def test_predictor_input_errors(trained, tmp_path):
    p = Predictor(trained.export(str(tmp_path / "exp")))
    rows = raw_rows(3, 4)
    for r in rows:
        del r["tags"]
    with pytest.raises(DataError, match=r"lack feature columns \['tags'\]"):
        p.predict(rows)
    with pytest.raises(DataError, match="must be a list of dicts"):
        p.predict(42)
    bad = raw_rows(3, 5)
    bad[1]["user"] = "not-a-number"
    with pytest.raises(DataError, match=r'row 1, column "user": expected a number like row 0'):
        p.predict(bad)
    with pytest.raises(ArgumentError, match="already exists"):
        trained.export(str(tmp_path / "exp"))
    w = tmp_path / "exp" / "embeddings" / "emb" / "shard-00000-of-00001" / "weights.npy"
    w.write_bytes(w.read_bytes()[:-4] + b"\x00\x00\x80\x7f")
    with pytest.raises(ChecksumError, match=r"weights\.npy is corrupt"):
        Predictor(str(tmp_path / "exp"))


def test_full_plus_delta_equals_full(tmp_path):
    torch.manual_seed(0)
    m = Custom()
    m.compile(
        tn.optimizer.Adam(0.02), loss={"ctr": "binary_crossentropy_from_logits", "cvr": "mse"}
    )
    d1 = batches(raw_rows(200, 10))
    m.fit(d1, verbose=0)
    g1 = m.save_weights(str(tmp_path / "m"), "d1")
    before = set(m.tables["emb"].keys().tolist())
    m.fit(batches(raw_rows(60, 11, shift=25)), verbose=0)  # updates some keys, creates others
    m.tables["emb"].show_decay(40)  # old, rarely seen keys fall below the threshold
    evicted = m.tables["emb"].evict()  # and deletes some
    g2 = m.save_weights(str(tmp_path / "m"), "d2")
    after = set(m.tables["emb"].keys().tolist())
    assert evicted > 0 and after - before and before - after
    for min_show in (None, 2.0):
        e1 = tn.export.checkpoint_rows(g1)["emb"]
        e2 = tn.export.checkpoint_rows(g2)["emb"]
        delta = export_delta(g1, g2, str(tmp_path / f"delta-{min_show}"), min_show=min_show)
        keep1 = np.ones_like(e1["keys"], bool) if min_show is None else e1["show"] >= min_show
        keep2 = np.ones_like(e2["keys"], bool) if min_show is None else e2["show"] >= min_show
        k, w = apply_delta(e1["keys"][keep1], e1["weights"][keep1], delta, "emb")
        np.testing.assert_array_equal(k, e2["keys"][keep2])
        np.testing.assert_array_equal(w, e2["weights"][keep2])
        doc = json.loads((tmp_path / f"delta-{min_show}" / "manifest.json").read_text())
        assert doc["since"] == "d1/1" and doc["to"] == "d2/2"
        assert (doc["since_generation"], doc["to_generation"]) == (1, 2)
        assert doc["format_version"] == 3 and doc["checksum"].startswith("sha256:")
        assert doc["tables"]["emb"]["dim"] == 4
        assert 0 < doc["tables"]["emb"]["updated"] < e2["keys"].shape[0]


def _onnx_parity(model, path):
    import onnxruntime as ort

    from tnrec.export import DenseGraph, example_args

    manifest = json.loads((path / "manifest.json").read_text())
    doc = manifest["onnx"]
    sess = ort.InferenceSession(str(path / doc["file"]))
    args = example_args(manifest["inputs"], manifest["num_dense"], batch=7)
    got = sess.run(None, {n: a.numpy() for n, a in zip(doc["inputs"], args, strict=True)})
    graph = DenseGraph(model, manifest["inputs"], [h["name"] for h in manifest["heads"]]).eval()
    with torch.no_grad():
        want = [o.numpy() for o in graph(*args)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_onnx_export_matches_for_a_custom_model_and_every_zoo_model(trained, tmp_path):
    from tnrec.models import build

    trained.export(str(tmp_path / "custom"), onnx=True)
    _onnx_parity(trained, tmp_path / "custom")
    for name in ("lr", "widedeep", "deepfm", "dcn"):
        torch.manual_seed(0)
        cols = [*tn.data.criteo_columns()[:3], *tn.data.criteo_columns()[13:17]]
        m = (
            build(name, cols)
            if name == "lr"
            else build(name, cols, embedding_dim=4, hidden_units=(8,))
        )
        m.compile()
        m.eval()
        m.export(str(tmp_path / name), onnx=True)
        _onnx_parity(m, tmp_path / name)
