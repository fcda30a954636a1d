"""bench/async_bench.py's target lines: the straggler ratio against the sync run with the same
straggler, the AUC against both sync baselines (the same batch per worker, equal updates)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import async_bench  # noqa: E402


def _run(mode, world, auc, sps, sleep_ms=0.0, k=0, straggler="none", equal=False):
    return {
        "mode": mode,
        "world": world,
        "k": k,
        "auc": auc,
        "sleep_ms": sleep_ms,
        "straggler": straggler,
        "equal_updates": equal,
        "asynchronous": mode == "async",
        "fig": {"others_sps": sps},
    }


def test_auc_is_judged_against_both_sync_runs_and_the_ratio_against_the_same_straggler():
    runs = [
        _run("sync", 2, 0.750, 100.0),
        _run("sync", 2, 0.758, 60.0, equal=True),
        _run("async", 2, 0.757, 110.0, k=4),
        _run("sync", 2, 0.750, 40.0, sleep_ms=80.0, straggler="2x"),
        _run("async", 2, 0.7545, 70.0, sleep_ms=80.0, k=4, straggler="2x"),
        _run("async", 2, 0.700, 70.0, k=16),  # k > 4: no AUC target
    ]
    lines, ok = async_bench.target_lines(runs)
    assert not ok
    assert lines[0].startswith("PASS W=2 k=4 2x straggler") and "1.75x sync's" in lines[0]
    auc = lines[1:]
    assert len(auc) == 4  # two async runs with k <= 4, two baselines each
    assert auc[0].startswith("MISS") and "vs sync 0.7500 (Δ +0.0070" in auc[0]
    assert auc[1].startswith("PASS") and "vs sync, equal updates 0.7580 (Δ -0.0010" in auc[1]
    assert auc[2].startswith("MISS") and "(Δ +0.0045" in auc[2]
    assert auc[3].startswith("MISS") and "(Δ -0.0035" in auc[3]


def test_a_failed_baseline_leaves_its_lines_out():
    runs = [
        {**_run("sync", 4, 0.0, 0.0), "error": "exit status 1"},
        _run("sync", 4, 0.757, 60.0, equal=True),
        _run("async", 4, 0.7565, 110.0, k=1),
    ]
    lines, ok = async_bench.target_lines(runs)
    assert ok
    assert lines == [
        "PASS W=4 k=1 straggler 0.0 ms: next-day AUC 0.7565 vs sync, equal updates 0.7570 "
        "(Δ -0.0005, target |Δ| <= 0.003)"
    ]
