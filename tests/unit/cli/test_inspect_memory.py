"""`tnrec train` with admission and a row cap: memory records and per-day counters in
runlog.jsonl, and `tnrec inspect` showing rows and bytes per part, skew and the counters."""

import json
import os

import pytest

from tnrec.cli import main
from tnrec.data.synthetic import SyntheticConfig, generate
from tnrec.runlog import read_runlog

TOML = """\
seed = 1
output_dir = "out"
columns = "criteo"

[model]
name = "lr"

[data]
dir = "data"
train_days = ["2024-05-10", "2024-05-11"]

[train]
epochs = 1
batch_size = 100
log_every = 3

[eviction]
max_rows = 1024

[admission]
min_show = 2.0
sketch_bytes = 65536
"""


@pytest.fixture(scope="module", params=["default-model-dir", "checkpoint-dir"])
def trained(request, tmp_path_factory):
    """``(output dir, model dir)`` of `tnrec train`: the model dir ``<output_dir>/model``,
    or a ``checkpoint.dir`` elsewhere (the run log is then found through model.json)."""
    root = tmp_path_factory.mktemp("inspect_memory")
    generate(root / "data", SyntheticConfig(rows_per_day=500, num_days=2, test_rows=100, seed=3))
    text = TOML
    if request.param == "checkpoint-dir":
        text += '\n[checkpoint]\ndir = "elsewhere/model"\n'
    (root / "run.toml").write_text(text)
    assert main(["train", "--config", str(root / "run.toml")]) == 0
    model_dir = root / ("elsewhere" if request.param == "checkpoint-dir" else "out") / "model"
    return root / "out", model_dir


def test_the_run_log_has_memory_records_and_day_counters(trained):
    out, _ = trained
    records = read_runlog(out)
    memory = [r for r in records if r["event"] == "memory"]
    assert [r["step"] for r in memory] == [3, 5] * 2  # 5 steps a day: step 3, the day's end
    for r in memory:
        emb = r["tables"]["wide"]
        assert emb["rows"] == emb["per_worker"]["rows"][0] > 0 and emb["skew"] == 1.0
        assert r["peak_rss_bytes"] > 0
    days = [r for r in records if r["event"] == "day"]
    assert [d["dt"] for d in days] == ["2024-05-10", "2024-05-11"]
    for d in days:
        assert d["keys_admitted"] > 0 and d["keys_refused"] > 0
        emb = d["tables"]["wide"]
        assert d["table_sizes"]["wide"] == emb["rows"] and emb["bytes"] > 0
        assert 0 < emb["sketch_fill"] < 1
    # the rows a day ends with are the last memory record's, less the day's eviction
    assert days[-1]["tables"]["wide"]["rows"] == (
        memory[-1]["tables"]["wide"]["rows"] - days[-1]["tables"]["wide"]["keys_evicted"]
    )


def test_inspect_shows_parts_skew_and_the_days_counters(trained, capsys):
    out, model_dir = trained
    assert main(["inspect", str(model_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    day = [r for r in read_runlog(out) if r["event"] == "day"][-1]
    emb = doc["tables"]["wide"]
    assert emb["keys"] == day["table_sizes"]["wide"] and emb["skew"] == 1.0
    [part] = emb["parts"]
    assert part["rank"] == 0 and part["rows"] == emb["keys"] and part["bytes"] == emb["bytes"]
    assert 0 < part["sketch_bytes"] < part["bytes"]
    counters = doc["day_counters"]
    assert counters["runlog"] == os.path.join(str(out), "runlog.jsonl")
    assert counters["dt"] == "2024-05-11"
    for k in ("keys_admitted", "keys_refused", "keys_evicted_cap", "keys_evicted"):
        assert counters[k] == day[k], k
    assert counters["tables"] == day["tables"]
    assert main(["inspect", str(model_dir)]) == 0
    text = capsys.readouterr().out
    assert ["table", "keys", "bytes", "skew", "dim", "optimizer", "policy"] in [
        ln.split() for ln in text.splitlines()
    ]
    assert "rows and bytes per part (worker)" in text
    assert f"day 2024-05-11 counters (from {counters['runlog']})" in text
    t = day["tables"]["wide"]
    counts = [f"{t[k]:,}" for k in ("keys_admitted", "keys_refused", "keys_evicted_cap")]
    expected = ["wide", *counts, f"{t['keys_evicted']:,}", f"{t['sketch_fill']:.3f}"]
    assert expected in [ln.split() for ln in text.splitlines()], text


def test_inspect_skips_a_cut_off_run_log_line_and_says_so(trained, capsys, tmp_path):
    out, model_dir = trained
    log = out / "runlog.jsonl"
    saved = log.read_text()
    try:
        log.write_text(saved + '{"event": "da')  # a run killed mid-write
        assert main(["inspect", str(model_dir)]) == 0
        assert "1 unreadable line(s) skipped" in capsys.readouterr().out
        log.write_text("\n".join(ln for ln in saved.splitlines() if '"day"' not in ln))
        assert main(["inspect", str(model_dir), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["day_counters"] is None
        assert main(["inspect", str(model_dir)]) == 0
        assert "counters (from" not in capsys.readouterr().out
    finally:
        log.write_text(saved)
