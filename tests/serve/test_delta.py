"""Complete deltas: the full export of day 1 plus the delta to day 2 predicts as the full
export of day 2 -- in the Predictor and in the running service."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tnrec as tn
from tests.serve.conftest import start_server
from tnrec.cli import main
from tnrec.errors import CheckpointError
from tnrec.export import DELTA_FORMAT
from tnrec.serving import Predictor


@pytest.fixture(scope="module")
def delta(exports):
    out = exports["work"] / "delta-10-11"
    model_dir = str(exports["work"] / "out" / "model")
    args = ["export", "--model-dir", model_dir, "--delta", "--since", "2024-05-10"]
    assert main([*args, "--to", "2024-05-11", "--out", str(out)]) == 0
    return str(out)


def test_a_delta_carries_the_dense_graph_of_its_second_checkpoint(delta, exports):
    manifest = tn.export.read_manifest(delta, DELTA_FORMAT)
    full = tn.export.read_manifest(exports["b"])
    for key in ("feature_spec", "num_dense", "inputs", "heads"):
        assert manifest["dense"][key] == full[key], key
    assert "dense.pt2" in manifest["files"]


def test_full_export_plus_delta_predicts_as_the_next_full_export(delta, exports):
    rows = exports["rows"]
    want = Predictor(exports["b"]).predict(rows)
    p = Predictor(exports["a"])
    before = p.predict(rows)
    updated = p.with_delta(delta)  # a new Predictor; p is unchanged
    np.testing.assert_array_equal(updated.predict(rows), want)
    np.testing.assert_array_equal(p.predict(rows), before)
    p.apply_delta(delta)  # in place
    np.testing.assert_array_equal(p.predict(rows), want)
    for table in tn.export.read_manifest(exports["b"])["tables"]:
        k, w = tn.export.load_dictionary(exports["b"], table)
        got = {r: shard for r, shard in p.dictionaries[table].items()}
        keys = np.concatenate([got[r][0] for r in sorted(got)])
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], k)
        weights = np.concatenate([got[r][1] for r in sorted(got)])
        np.testing.assert_array_equal(weights[order], w)


def test_a_delta_for_another_base_or_without_its_graph_is_refused(delta, exports, tmp_path):
    with pytest.raises(CheckpointError, match="applies to an export of generation"):
        Predictor(exports["b"]).with_delta(delta)  # b is already at the delta's second day
    rows_only = tmp_path / "rows-only"
    model_dir = exports["work"] / "out" / "model"
    ckpts = [tn.checkpoint.latest(str(model_dir), d) for d in ("2024-05-10", "2024-05-11")]
    tn.export.export_delta(ckpts[0], ckpts[1], str(rows_only))
    with pytest.raises(CheckpointError, match="no dense graph"):
        Predictor(exports["a"]).with_delta(str(rows_only))


def test_the_service_takes_a_delta_while_serving(delta, exports):
    rows = exports["rows"][:20]
    want = Predictor(exports["b"]).predict(rows)
    with start_server(exports["a"]) as s:
        r = s.post("/v1/reload", {"delta": delta})
        assert r.status_code == 200, r.text
        version = r.json()["model_version"]
        assert version.startswith("a+delta-10-11@"), version
        got = s.post("/v1/predict", {"rows": json.loads(json.dumps(rows))}).json()
        assert got["model_version"] == version
        np.testing.assert_allclose(got["predictions"], want, rtol=1e-6, atol=1e-7)
        r = s.post("/v1/reload", {"delta": delta})  # applied already: its base is gone
        assert r.status_code == 422 and "applies to an export of generation" in r.json()["error"]
        assert s.get("/readyz").json()["model_version"] == version


def test_a_compiled_predictor_compiles_the_deltas_graph_too(delta, exports, aot_cache):
    rows = exports["rows"]
    want = Predictor(exports["b"]).predict(rows)
    p = Predictor(exports["a"], aot=True, aot_cache=aot_cache)
    assert p.graph_kind == "aot", p.aot_error
    updated = p.with_delta(delta)
    assert updated.graph_kind == "aot", updated.aot_error
    assert updated.graph is not p.graph
    np.testing.assert_allclose(updated.predict(rows), want, rtol=0, atol=1e-6)
