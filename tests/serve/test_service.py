"""``tnrec serve`` over HTTP on 127.0.0.1: parity, bad input, concurrency, reloads, workers,
metrics."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import start_server
from tnrec.cli import main
from tnrec.errors import DataError
from tnrec.serving import Predictor


def _expected(export: str, rows: list[dict]) -> np.ndarray:
    return np.asarray(Predictor(export).predict(rows), np.float64)


def _columns(rows: list[dict]) -> dict[str, list]:
    return {k: [r[k] for r in rows] for k in rows[0]}


@pytest.fixture(scope="module")
def server(exports):
    with start_server(exports["a"], "--max-rows", "500") as s:
        yield s


def test_predictions_equal_the_predictors_in_both_body_forms(server, exports):
    rows = exports["rows"]
    want = _expected(exports["a"], rows)
    got_rows, got_cols = [], []
    for a in range(0, len(rows), 37):  # requests of several sizes, the last one short
        chunk = rows[a : a + 37]
        r = server.post("/v1/predict", {"rows": chunk})
        assert r.status_code == 200, r.text
        got_rows += r.json()["predictions"]
        r = server.post("/v1/predict", {"columns": _columns(chunk)})
        assert r.status_code == 200, r.text
        got_cols += r.json()["predictions"]
        assert r.json()["model_version"].startswith("a@")
    np.testing.assert_allclose(got_rows, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got_cols, want, rtol=1e-6, atol=1e-7)
    r = server.post("/v1/predict", {"rows": []})  # an empty request: no predictions
    assert r.status_code == 200 and r.json()["predictions"] == []


def test_unseen_keys_and_missing_values_are_served(server, exports):
    row = dict(exports["rows"][0])
    unseen = {k: (987654321 if isinstance(v, int) else v) for k, v in row.items()}
    missing = {k: None for k in row}
    r = server.post("/v1/predict", {"rows": [unseen, missing]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        r.json()["predictions"], _expected(exports["a"], [unseen, missing]), rtol=1e-6
    )


BAD = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", 'must be a JSON object with "rows"'),
    (b'{"rows": [], "columns": {}}', 'must be a JSON object with "rows"'),
    (b'{"rows": [1]}', "row 0 must be a dict"),
    (b'{"rows": "x"}', "must be a list of dicts"),
    (b'{"columns": {"C1": [1, 2], "C2": [1]}}', "lack feature columns"),
]


@pytest.mark.parametrize(("body", "message"), BAD)
def test_bad_bodies_get_a_400_with_the_message(server, body, message):
    r = server.post("/v1/predict", content=body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_bad_values_get_the_predictors_message(server, exports):
    row = dict(exports["rows"][0])
    dense, sparse = "I2", "C1"  # a numeric and a categorical feature column
    cases = [  # (the request's rows, what the message names)
        ([{k: v for k, v in row.items() if k != sparse}], f"lack feature columns ['{sparse}']"),
        ([row, {**row, dense: {"a": 1}}], f'row 1, column "{dense}"'),
        ([row, {**row, dense: "not a number"}], f'row 1, column "{dense}"'),
        ([row, {**row, sparse: {"x": 1}}], f'row 1, column "{sparse}"'),
        # JSON integers beyond 64 bits read as floats (orjson): not text, refused
        ([row, {**row, sparse: 2**70}], f'row 1, column "{sparse}": expected text'),
    ]
    predictor = Predictor(exports["a"])
    for rows, message in cases:
        r = server.post("/v1/predict", {"rows": rows})
        assert r.status_code == 400, r.text
        with pytest.raises(DataError) as e:
            predictor.predict(orjson.loads(json.dumps(rows)))  # as the service reads it
        assert r.json()["error"] == str(e.value)  # the Predictor's own message
        assert message in r.json()["error"], r.json()["error"]
    r = server.post("/v1/predict", {"rows": [row] * 501})
    assert r.status_code == 400 and "at most 500" in r.json()["error"]
    assert server.post("/v1/predict", {"rows": [row]}).status_code == 200  # still serving


def test_concurrent_requests_are_merged_and_routed_back(exports):
    rows = exports["rows"][:120]
    want = _expected(exports["a"], rows)

    async def fire(url: str) -> list:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [
                client.post(url + "/v1/predict", json={"rows": rows[i : i + 3]})
                for i in range(0, len(rows), 3)
            ]
            return await asyncio.gather(*calls)

    with start_server(exports["a"], "--max-wait-ms", "20", "--max-batch", "64") as s:
        answers = asyncio.run(fire(s.url))
        metrics = _metrics(s.get("/metrics").text)
    got = [p for r in answers for p in r.json()["predictions"]]
    assert all(r.status_code == 200 for r in answers)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    calls = metrics["tnrec_batch_requests"]["count"]
    merged = metrics["tnrec_batch_requests"]["sum"]
    assert merged == 40 and calls < 40, (calls, merged)  # 40 requests in fewer calls
    assert metrics["tnrec_batch_rows"]["max_bucket_le"] <= 64


ARROW = {"content-type": "application/vnd.apache.arrow.stream"}


def _arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _post_arrow(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url + "/v1/predict", content=body, headers=ARROW, timeout=60)


def test_arrow_ipc_bodies_are_served_as_the_predictor_serves_the_table(server, exports):
    rows = exports["rows"]
    want = _expected(exports["a"], rows)
    got = []
    for a in range(0, len(rows), 53):
        table = pa.Table.from_pylist(rows[a : a + 53])
        r = _post_arrow(server.url, _arrow_body(table))
        assert r.status_code == 200, r.text
        got += r.json()["predictions"]
        assert r.json()["model_version"].startswith("a@")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    empty = pa.Table.from_pylist(rows[:1]).slice(0, 0)
    r = _post_arrow(server.url, _arrow_body(empty))
    assert r.status_code == 200 and r.json()["predictions"] == []


def test_bad_arrow_bodies_get_a_400_with_the_message(server, exports):
    row = dict(exports["rows"][0])
    table = pa.Table.from_pylist([row, row])
    cases = [
        (b"not arrow", "not an Arrow IPC stream"),
        (_arrow_body(table)[:40], "not an Arrow IPC stream"),  # cut short
        (_arrow_body(table.drop_columns(["C1"])), "lack feature columns ['C1']"),
        (_arrow_body(pa.Table.from_pylist([row] * 501)), "at most 500"),
        (_arrow_body(table.append_column("C1", table.column("C1"))), "more than once"),
    ]
    bad = table.set_column(table.schema.get_field_index("I2"), "I2", pa.array([1.0, float("inf")]))
    with pytest.raises(DataError) as e:
        Predictor(exports["a"]).predict(bad)
    cases.append((_arrow_body(bad), str(e.value)))  # the Predictor's own message
    for body, message in cases:
        r = _post_arrow(server.url, body)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"], r.json()["error"]
    assert _post_arrow(server.url, _arrow_body(table)).status_code == 200  # still serving


def test_concurrent_arrow_requests_are_merged_and_routed_back(exports):
    rows = exports["rows"][:120]
    want = _expected(exports["a"], rows)
    bodies = [_arrow_body(pa.Table.from_pylist(rows[i : i + 4])) for i in range(0, 120, 4)]

    async def fire(url: str) -> list:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [client.post(url + "/v1/predict", content=b, headers=ARROW) for b in bodies]
            return await asyncio.gather(*calls)

    with start_server(exports["a"], "--max-wait-ms", "20", "--max-batch", "64") as s:
        answers = asyncio.run(fire(s.url))
        metrics = _metrics(s.get("/metrics").text)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    got = [p for r in answers for p in r.json()["predictions"]]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    calls = metrics["tnrec_batch_requests"]["count"]
    assert metrics["tnrec_batch_requests"]["sum"] == 30 and calls < 30, calls


def _metrics(text: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        d = out.setdefault(family.name, {"samples": []})
        for s in family.samples:
            d["samples"].append(s)
            if s.name.endswith("_count"):
                d["count"] = d.get("count", 0) + s.value
            elif s.name.endswith("_sum"):
                d["sum"] = d.get("sum", 0) + s.value
        buckets = [
            float(s.labels["le"])
            for s in family.samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
        ]
        counts = [
            s.value
            for s in family.samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
        ]
        if buckets:  # the smallest bucket that holds every observation
            total = d.get("count", 0)
            d["max_bucket_le"] = min(
                (le for le, c in zip(buckets, counts, strict=True) if c >= total), default=None
            )
    return out


def test_metrics_parse_as_prometheus_text(server, exports):
    server.post("/v1/predict", {"rows": exports["rows"][:2]})
    server.post("/v1/predict", content=b"{bad")
    m = _metrics(server.get("/metrics").text)
    codes = {
        s.labels["code"]: s.value for s in m["tnrec_requests"]["samples"] if "code" in s.labels
    }
    assert codes["200"] >= 1 and codes["400"] >= 1
    version = [s for s in m["tnrec_model_info"]["samples"] if s.value == 1]
    assert [s.labels["version"] for s in version] == [server.get("/readyz").json()["model_version"]]
    assert m["tnrec_dictionary_bytes"]["samples"][0].value > 0
    assert m["tnrec_request_seconds"]["count"] >= 2
    assert "tnrec_queue_rows" in m and "tnrec_model_load_seconds" in m
    assert server.get("/healthz").json() == {"status": "ok"}


def _stream(server, rows, expected, stop, seen, errors):
    """Predict in a loop until ``stop``; check each answer against its version's numbers."""
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            r = client.post(server.url + "/v1/predict", json={"rows": rows})
            if r.status_code != 200:
                errors.append(r.text)
                continue
            doc = r.json()
            version = doc["model_version"][0]  # "a@..." or "b@..."
            seen.add(version)
            if not np.allclose(doc["predictions"], expected[version], rtol=1e-6, atol=1e-7):
                errors.append(f"{version}: predictions of another version")


def test_reloads_during_a_stream_of_requests_drop_nothing(exports, tmp_path):
    rows = exports["rows"][:16]
    expected = {v: _expected(exports[v], rows) for v in ("a", "b")}
    assert not np.allclose(expected["a"], expected["b"])  # the versions differ
    with start_server(exports["a"]) as s:
        stop, seen, errors = threading.Event(), set(), []
        clients = [
            threading.Thread(target=_stream, args=(s, rows, expected, stop, seen, errors))
            for _ in range(3)
        ]
        for t in clients:
            t.start()
        for target in ("b", "a", "b", "a", "b"):  # 5 reloads
            time.sleep(0.3)
            r = s.post("/v1/reload", {"export": exports[target]})
            assert r.status_code == 200, r.text
            assert r.json()["model_version"].startswith(f"{target}@")
        time.sleep(0.3)
        stop.set()
        for t in clients:
            t.join()
        assert errors == []
        assert seen == {"a", "b"}
        m = _metrics(s.get("/metrics").text)
        loads = {x.labels["result"]: x.value for x in m["tnrec_model_loads"]["samples"]}
        assert loads.get("ok") == 6  # the first load and five reloads


def test_a_failed_reload_keeps_the_old_model_serving(server, exports, tmp_path):
    before = server.get("/readyz").json()["model_version"]
    r = server.post("/v1/reload", {"export": str(tmp_path / "nothing")})
    assert r.status_code == 422 and "No export at" in r.json()["error"]
    assert r.json()["model_version"] == before
    damaged = tmp_path / "damaged"
    shutil.copytree(exports["b"], damaged)
    weights = next(damaged.rglob("weights.npy"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    r = server.post("/v1/reload", {"export": str(damaged)})
    assert r.status_code == 422 and str(weights) in r.json()["error"]
    ready = server.get("/readyz").json()
    assert ready["model_version"] == before and str(weights) in ready["last_reload_error"]
    rows = exports["rows"][:5]
    r = server.post("/v1/predict", {"rows": rows})
    np.testing.assert_allclose(r.json()["predictions"], _expected(exports["a"], rows), rtol=1e-6)
    for bad in (b"{x", b'{"export": 3}'):
        assert server.post("/v1/reload", content=bad).status_code == 400


def test_two_workers_share_the_dictionaries_and_follow_a_reload(exports):
    rows = exports["rows"][:8]
    with start_server(exports["a"], "--workers", "2") as s:
        pids = s.worker_pids()
        assert len(pids) == 2, pids
        for pid in pids:  # each worker maps the export's dictionary files: one shared copy
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert f"{exports['a']}/embeddings/" in maps and "weights.npy" in maps
        r = s.post("/v1/reload", {"export": exports["b"]})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        versions: set[str] = set()
        while time.monotonic() < deadline:
            versions = {s.get("/readyz").json()["model_version"][0] for _ in range(20)}
            if versions == {"b"}:
                break
            time.sleep(0.2)
        assert versions == {"b"}  # every worker serves the new export
        got = s.post("/v1/predict", {"rows": rows}).json()["predictions"]
        np.testing.assert_allclose(got, _expected(exports["b"], rows), rtol=1e-6)
        m = _metrics(s.get("/metrics").text)
        served = {x.labels["pid"] for x in m["tnrec_model_info"]["samples"] if x.value == 1}
        assert served == {str(p) for p in pids}  # /metrics sums the workers


def test_watch_serves_what_latest_names(exports, tmp_path):
    watch = tmp_path / "exports"
    watch.mkdir()
    for name in ("a", "b"):
        shutil.copytree(exports[name], watch / name)
    (watch / "_latest").write_bytes(orjson.dumps({"export": "a"}))
    with start_server(str(watch / "a"), "--watch", str(watch)) as s:
        assert s.get("/readyz").json()["model_version"].startswith("a@")
        (watch / "_latest").write_bytes(orjson.dumps({"export": "b"}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if s.get("/readyz").json()["model_version"].startswith("b@"):
                break
            time.sleep(0.1)
        assert s.get("/readyz").json()["model_version"].startswith("b@")
        (watch / "_latest").write_bytes(orjson.dumps({"export": "missing"}))
        time.sleep(1.0)  # a target that fails to load leaves the old one serving
        assert s.get("/readyz").json()["model_version"].startswith("b@")
        # tnrec export --latest writes the pointer the service follows
        model_dir = str(exports["work"] / "out" / "model")
        args = ["export", "--model-dir", model_dir, "--dt", "2024-05-10"]
        assert main([*args, "--out", str(watch / "c"), "--latest"]) == 0
        assert orjson.loads((watch / "_latest").read_bytes()) == {"export": "c"}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if s.get("/readyz").json()["model_version"].startswith("c@"):
                break
            time.sleep(0.1)
        assert s.get("/readyz").json()["model_version"].startswith("c@")


def test_serve_refuses_a_missing_export_by_name(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "No export at" in capsys.readouterr().err


def test_the_service_predicts_what_tnrec_predict_does(exports, tmp_path):
    """Parity with the training model's own predictions (``tnrec predict`` on the test days)."""
    out = tmp_path / "p.parquet"
    model_dir = str(exports["work"] / "out" / "model")
    assert main(["predict", "--model-dir", model_dir, "--output", str(out)]) == 0
    import pyarrow.parquet as pq

    want = pq.read_table(out)["prediction"].to_numpy()
    rows = json.loads(json.dumps(exports["rows"]))
    with start_server(exports["b"]) as s:  # the export of the checkpoint predict loads
        got = s.post("/v1/predict", {"rows": rows}).json()["predictions"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_the_workers_listening_socket_is_a_tcp_one():
    """asyncio sets TCP_NODELAY on connections of an IPPROTO_TCP listener only; without it each
    answer of a worker would wait for the client's delayed ACK."""
    import socket

    from tnrec.serve import _listen

    sock = _listen("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP and sock.get_inheritable()
    finally:
        sock.close()


def test_aot_serves_the_compiled_graph_and_says_so(exports, aot_cache, tmp_path):
    rows = exports["rows"][:120]
    want = _expected(exports["a"], rows)
    with start_server(exports["a"], "--aot", "--aot-cache", aot_cache) as s:
        ready = s.get("/readyz").json()
        assert ready["graph"] == "aot" and ready["aot_error"] is None
        got = s.post("/v1/predict", {"rows": rows}).json()["predictions"]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # A cache that cannot be written: the exported program serves, and /readyz says why.
    blocked = tmp_path / "not_a_dir"
    blocked.write_text("a file where the cache should be")
    with start_server(exports["a"], "--aot", "--aot-cache", str(blocked)) as s:
        ready = s.get("/readyz").json()
        assert ready["graph"] == "exported" and ready["aot_error"]
        got = s.post("/v1/predict", {"rows": rows}).json()["predictions"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    with start_server(exports["a"]) as s:  # without --aot: the exported program
        assert s.get("/readyz").json()["graph"] == "exported"


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--inline-rows", "-1"), ("--max-wait-ms", "-0.5"), ("--max-batch", "0")],
    ids=["inline-rows", "max-wait-ms", "max-batch"],
)
def test_serve_refuses_a_negative_batching_flag_by_name(exports, capsys, flag, value):
    assert main(["serve", exports["a"], flag, value]) == 2
    assert f"argument {flag}: must be" in capsys.readouterr().err
