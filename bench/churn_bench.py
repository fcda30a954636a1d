"""Id churn over 7 synthetic days: unbounded tables vs admission vs admission + a row cap.

The churn run of issue 16 ("The proof")::

    NUMBA_CACHE_DIR=.numba_cache python bench/churn_bench.py          # ~15-20 minutes, 2 cores
    NUMBA_CACHE_DIR=.numba_cache python bench/churn_bench.py --quick  # seconds
    python bench/churn_bench.py --out churn.json --md churn.md

One data set, three settings (and a fourth, see below), each trained by
``tnrec train --eval-next-day`` in a subprocess of its own (so its peak RSS,
from ``os.wait4``, is its own):

1. **unbounded**: every key seen gets a row and keeps it (no eviction);
2. **admission**: ``[admission] min_show = 2`` -- a key gets a row at its first
   training pull after its accumulated show reached 2 (so at its third
   occurrence, or its second within one batch);
3. **admission + cap**: the same and ``[eviction] max_rows`` = half the final
   rows of the unbounded run's largest table (the cap is per table; DeepFM's
   two tables hold the same keys, so the total cap is half the unbounded total);
4. **admission + cap/2** (``--binding-cap``, by default only when setting 3's
   cap evicted nothing): a cap at half the admission run's largest table. With
   a long one-off tail, admission alone keeps the tables well under half the
   unbounded size and setting 3's cap is never reached; this one binds, and
   shows what a cap that evicts costs.

The data: the synthetic Criteo-schema generator (``tnrec.data.synthetic``) in
its churn mode, 7 training days and the day after them (its ``test`` split,
drawn from the same hidden model with ids of its own). In the columns of at
least ``churn_min_cardinality`` base ids, a share ``--new-id-share`` (default
0.3) of each day's values are ids that exist on that day only, each seen about
twice; with the Zipf tail of the large base vocabularies this makes most of
the unbounded table's keys ids of one day (the share is measured from the
Parquet files and printed).

Next-day AUC: the model after training day ``d`` scored on day ``d + 1``
(streaming AUC, ``tnrec.metrics.AUC``): the ``next_day_auc`` of the run log's
record of day ``d + 1`` for ``d`` = 1..6, and the config's test split (the
8th day) for ``d`` = 7. ΔAUC is a setting's AUC minus the unbounded run's,
averaged over the 7 next-day AUCs (scored on days 2-8); the verdict is
``|mean ΔAUC| <= 0.003`` and the table shows every day's ΔAUC too.

The model is DeepFM (embedding dim 16, MLP 256-128, batch 2048, FTRL on the
tables and Adam on the dense part: the settings ``bench/synthetic_quality.py``
measured best, scaled to the batch). DeepFM rather than LR because its
embedding table is where the memory goes (16 floats and their FTRL state per
key against LR's one) and because evicting a key's embedding also changes the
FM and MLP terms, a harder test of the cap's cost than LR's one weight.

Per setting and day the table prints the rows of all tables, their bytes
(index, rows, optimizer state and the admission sketch, 16 MiB a table by
default, summed over tables, at the day's end), the keys admitted, the
training pulls refused a row and the rows evicted by the cap that day, and
the next-day AUC; the summary adds the peak RSS of each setting's process.
MB are 2^20 bytes, as in the other benches.

The cap held if no table ever held more than ``max_rows`` + the most keys
one batch can create, read at each day's end and from the run log's memory
records every ``--log-every`` steps (after a push, so after the cap's
eviction; the between-pull-and-push peak is not observable from outside).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tnrec.data import synthetic as S

SETTINGS = ("unbounded", "admission", "admission+cap")
AUC_TOLERANCE = 0.003
MIN_SHOW = 2.0


# --------------------------------------------------------------------------- data


def make_data(root: str, rows_per_day: int, num_days: int, new_id_share: float) -> dict:
    """Generate (or reuse) the churn data in ``root``; return its ``_synthetic.json``."""
    cfg = S.SyntheticConfig(rows_per_day=rows_per_day, num_days=num_days, new_id_share=new_id_share)
    meta_path = os.path.join(root, "_synthetic.json")
    if os.path.exists(meta_path):
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        want = {"rows_per_day": rows_per_day, "num_days": num_days, "new_id_share": new_id_share}
        have = {k: meta["config"][k] for k in want}
        if meta["version"] != S.GENERATOR_VERSION or have != want:
            raise SystemExit(f"{root} holds other data ({have}); pick another --data")
        return meta
    S.generate(root, cfg)
    with open(meta_path, encoding="utf-8") as f:
        return json.load(f)


def _hex_values(col: pa.ChunkedArray) -> np.ndarray:
    """The non-null 8-character values of a categorical column as uint64 (their bytes)."""
    arr = pc.drop_null(col).combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
    if offsets[-1] - offsets[0] != 8 * len(arr):
        raise RuntimeError("internal error: a categorical value is not 8 characters")
    data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    return data.view(np.uint64)  # [N] one value per 8 bytes


def one_off_share(root: str, days: list[str]) -> dict[str, float]:
    """Distinct (column, value) keys of the training days, and the shares of one-off ones.

    Returns ``keys`` (distinct keys over all days: the unbounded table's rows),
    ``one_day_share`` (keys seen on one day only), ``once_share`` (keys seen
    exactly once) and ``refused_share`` (keys seen fewer than 3 times: never
    admitted by ``min_show = 2`` unless twice in one batch).
    """
    keys = one_day = once = rare = 0
    for c in S.CATEGORICAL_COLUMNS:
        per_day = []
        for dt in days:
            path = os.path.join(root, dt, "part-00000.parquet")
            per_day.append(_hex_values(pq.read_table(path, columns=[c])[c]))
        everything = np.concatenate(per_day)
        _, counts = np.unique(everything, return_counts=True)
        _, day_counts = np.unique(
            np.concatenate([np.unique(v) for v in per_day]), return_counts=True
        )
        keys += counts.shape[0]
        once += int((counts == 1).sum())
        rare += int((counts < 3).sum())
        one_day += int((day_counts == 1).sum())
    return {
        "keys": keys,
        "one_day_share": one_day / keys,
        "once_share": once / keys,
        "refused_share": rare / keys,
    }


# --------------------------------------------------------------------------- one setting


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(x) for x in items) + "]"


def write_config(
    path: str, data: str, days: list[str], a: argparse.Namespace, admission: bool, cap: int | None
) -> None:
    """Write the run config of one setting (the same model, data and seed in every setting)."""
    b = a.batch_size
    lines = [
        "seed = 0",
        f"output_dir = {json.dumps(os.path.dirname(path))}",
        'columns = "criteo"',
        "[model]",
        f'name = "{a.model}"',
        "embedding_dim = 16",
        "hidden_units = [256, 128]",
        "[data]",
        f"dir = {json.dumps(data)}",
        f"train_days = {_toml_list(days)}",
        'test_days = ["test"]',  # the day after the last training day
        "[optimizer.sparse]",  # bench/synthetic_quality.py's measured best, scaled to the batch
        'type = "ftrl"',
        "learning_rate = 0.05" if a.model == "deepfm" else "learning_rate = 0.1",
        f"beta = {4.096 / b!r}" if a.model == "deepfm" else f"beta = {5.12 / b!r}",
        "l1 = 0.0",
        f"l2 = {40.96 / b!r}" if a.model == "deepfm" else "l2 = 0.0",
        "[optimizer.dense]",
        'type = "adam"',
        "learning_rate = 0.001" if a.model == "deepfm" else "learning_rate = 0.01",
        "[train]",
        f"batch_size = {b}",
        f"log_every = {a.log_every}",
        "[eviction]",
        "show_decay_rate = 0.98",  # no show_threshold / max_unseen_days: no day-end eviction
    ]
    if cap is not None:
        lines += [f"max_rows = {cap}", "low_water = 0.95"]
    if admission:
        lines += ["[admission]", f"min_show = {MIN_SHOW}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def run_setting(run_dir: str, env: dict[str, str]) -> tuple[int, float]:
    """Run ``tnrec train --eval-next-day`` on ``run_dir/run.toml``; return (peak RSS, seconds).

    ``os.wait4`` returns the child's own resource usage, so each setting's
    peak RSS is its own (``RUSAGE_CHILDREN`` would be the max over children).
    """
    cmd = [sys.executable, "-m", "tnrec.cli", "train", "--config", "run.toml", "--eval-next-day"]
    t0 = time.perf_counter()
    with open(os.path.join(run_dir, "train.log"), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        with open(os.path.join(run_dir, "train.log"), encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{run_dir}: tnrec train exited {proc.returncode}:\n{tail}")
    return usage.ru_maxrss * 1024, secs  # ru_maxrss is KiB on Linux


def read_runlog(run_dir: str) -> dict[str, Any]:
    """Per day rows, bytes, counters and next-day AUC, and the max rows per table seen.

    ``next_day_auc[d]`` is the AUC of the model after day ``d`` on day ``d + 1``.
    """
    with open(os.path.join(run_dir, "runlog.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    days = [r for r in records if r.get("event") == "day"]
    summary = next(r for r in records if r.get("event") == "train")
    mem = [r for r in records if r.get("event") == "memory"]
    per_day = []
    for i, r in enumerate(days):
        tables = r.get("tables") or {}
        nxt = days[i + 1]["next_day_auc"] if i + 1 < len(days) else summary.get("val_auc")
        per_day.append(
            {
                "dt": r["dt"],
                "rows_trained": r["rows"],
                "table_rows": sum(r["table_sizes"].values()),
                "table_sizes": r["table_sizes"],
                "bytes": sum(int(t.get("bytes", 0)) for t in tables.values()) if tables else None,
                "keys_created": r["keys_created"],
                "keys_admitted": r.get("keys_admitted"),
                "keys_refused": r.get("keys_refused"),
                "keys_evicted_cap": r.get("keys_evicted_cap"),
                "sketch_fill": max((t.get("sketch_fill", 0.0) for t in tables.values()), default=0),
                "next_day_auc": nxt,
            }
        )
    max_rows_seen: dict[str, int] = {}
    for r in [*mem, *days]:
        sizes = r.get("table_sizes") or {
            n: t["rows"] for n, t in (r.get("tables") or {}).items() if "rows" in t
        }
        for name, rows in sizes.items():
            max_rows_seen[name] = max(max_rows_seen.get(name, 0), int(rows))
    return {
        "days": per_day,
        "max_rows_seen": max_rows_seen,
        "memory_records": len(mem),
        "peak_rss_in_runlog": max((int(r.get("peak_rss_bytes", 0)) for r in mem), default=None),
        "train_s": summary.get("train_s"),
    }


# --------------------------------------------------------------------------- the report


def _fmt(x: Any, spec: str = ",") -> str:
    return "-" if x is None else format(x, spec)


def summarize(name: str, res: dict[str, Any], base: dict[str, Any] | None, a: Any) -> dict:
    """Final rows and bytes, peak RSS, mean next-day AUC, ΔAUC vs unbounded, the cap check."""
    days = res["days"]
    aucs = np.array([np.nan if d["next_day_auc"] is None else d["next_day_auc"] for d in days])
    out: dict[str, Any] = {
        "setting": name,
        "final_rows": days[-1]["table_rows"],
        "final_bytes": days[-1]["bytes"],
        "peak_rss_bytes": res["peak_rss_bytes"],
        "mean_next_day_auc": float(np.nanmean(aucs)),
        "keys_evicted_cap": sum(d["keys_evicted_cap"] or 0 for d in days),
    }
    if base is not None:
        ref = np.array([np.nan if d["next_day_auc"] is None else d["next_day_auc"] for d in base])
        delta = aucs - ref  # [days]
        out["delta_auc_per_day"] = [float(x) for x in delta]
        out["delta_auc_mean"] = float(np.nanmean(delta))
        out["delta_auc_worst"] = float(delta[np.nanargmax(np.abs(delta))])
        out["auc_ok"] = bool(abs(out["delta_auc_mean"]) <= AUC_TOLERANCE)
    cap = res.get("max_rows")
    if cap is not None:
        seen = max(res["max_rows_seen"].values())
        slack = a.batch_size * len(S.CATEGORICAL_COLUMNS)  # the most keys one batch creates
        out.update(
            max_rows=cap,
            max_table_rows_seen=seen,
            cap_slack=slack,
            cap_held=bool(seen <= cap + slack),
            cap_held_strictly=bool(seen <= cap),
            cap_bound=out["keys_evicted_cap"] > 0,
        )
    return out


def day_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The per setting and day table, markdown."""
    head = (
        "| setting | day | rows (all tables) | MB | admitted | refused pulls | evicted by cap "
        "| next-day AUC | ΔAUC |"
    )
    lines = [head, "|" + "---|" * 9]
    base = results["unbounded"]["days"]
    for name, res in results.items():
        for i, d in enumerate(res["days"]):
            auc, ref = d["next_day_auc"], base[i]["next_day_auc"]
            delta = "" if name == "unbounded" or auc is None or ref is None else f"{auc - ref:+.4f}"
            mb = None if d["bytes"] is None else d["bytes"] / 2**20
            lines.append(
                f"| {name} | {i + 1} {d['dt']} | {d['table_rows']:,} | {_fmt(mb, ',.1f')} "
                f"| {_fmt(d['keys_admitted'])} | {_fmt(d['keys_refused'])} "
                f"| {_fmt(d['keys_evicted_cap'])} | {_fmt(auc, '.4f')} | {delta} |"
            )
    return lines


def summary_table(summaries: list[dict[str, Any]]) -> list[str]:
    """One row per setting, markdown, then the verdict lines."""
    lines = [
        "| setting | max_rows (per table) | final rows | final MB | peak RSS MB "
        "| mean next-day AUC | mean ΔAUC | worst-day ΔAUC | evicted by cap | max rows seen "
        "| cap held |",
        "|" + "---|" * 11,
    ]
    for s in summaries:
        mb = None if s["final_bytes"] is None else s["final_bytes"] / 2**20
        held = "-"
        if "cap_held" in s:
            held = "yes" if s["cap_held"] else "NO"
            held += "" if s["cap_bound"] else " (never reached)"
        lines.append(
            f"| {s['setting']} | {_fmt(s.get('max_rows'))} | {s['final_rows']:,} "
            f"| {_fmt(mb, ',.1f')} | {s['peak_rss_bytes'] / 2**20:,.0f} "
            f"| {s['mean_next_day_auc']:.4f} | {_fmt(s.get('delta_auc_mean'), '+.4f')} "
            f"| {_fmt(s.get('delta_auc_worst'), '+.4f')} | {s['keys_evicted_cap']:,} "
            f"| {_fmt(s.get('max_table_rows_seen'))} | {held} |"
        )
    return lines


def verdicts(summaries: list[dict[str, Any]]) -> list[str]:
    """One plain line per capped setting: cap held or not, AUC within 0.003 or MISSED."""
    out = []
    for s in summaries:
        if "max_rows" not in s:
            continue
        cap = "held" if s["cap_held"] else "NOT held"
        if not s["cap_bound"]:
            cap += " (the table never reached it: no key was evicted by the cap)"
        auc = (
            f"|mean ΔAUC| = {abs(s['delta_auc_mean']):.4f} <= {AUC_TOLERANCE}: met"
            if s["auc_ok"]
            else f"MISSED: mean ΔAUC = {s['delta_auc_mean']:+.4f} (tolerance {AUC_TOLERANCE})"
        )
        out.append(
            f"{s['setting']}: cap {s['max_rows']:,} rows per table {cap}; max rows seen "
            f"{s['max_table_rows_seen']:,} (allowed {s['max_rows'] + s['cap_slack']:,} = cap + "
            f"one batch's keys); {auc}; final rows {s['final_rows']:,} vs unbounded "
            f"{summaries[0]['final_rows']:,}"
        )
    return out


# --------------------------------------------------------------------------- main


def run_one(
    name: str, root: str, data: str, days: list[str], a: Any, admission: bool, cap: int | None
) -> dict[str, Any]:
    """Train one setting in a fresh run dir; return its run-log figures and peak RSS."""
    run_dir = os.path.join(root, name.replace("+", "_"))
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    write_config(os.path.join(run_dir, "run.toml"), data, days, a, admission, cap)
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", os.path.abspath(".numba_cache"))
    print(f"{name}: training {len(days)} days (max_rows {_fmt(cap)}) ...", flush=True)
    rss, secs = run_setting(run_dir, env)
    res = read_runlog(run_dir)
    res.update(peak_rss_bytes=rss, wall_s=secs, max_rows=cap, admission=admission)
    last = res["days"][-1]
    print(
        f"{name}: {secs:.0f} s, final rows {last['table_rows']:,}, peak RSS "
        f"{rss / 2**20:,.0f} MB, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return res


def run_all(root: str, data: str, days: list[str], a: Any) -> dict[str, dict[str, Any]]:
    """The three settings in order: the cap is half the unbounded run's largest table."""
    results = {"unbounded": run_one("unbounded", root, data, days, a, False, None)}
    final = results["unbounded"]["days"][-1]["table_sizes"]
    cap = max(1024, max(final.values()) // 2)  # EvictionPolicy needs >= 1024 (1 per bucket)
    results["admission"] = run_one("admission", root, data, days, a, True, None)
    results["admission+cap"] = run_one("admission+cap", root, data, days, a, True, cap)
    bound = sum(d["keys_evicted_cap"] or 0 for d in results["admission+cap"]["days"]) > 0
    if a.binding_cap == "always" or (a.binding_cap == "auto" and not bound):
        # With a long one-off tail, admission alone may keep the table under half the
        # unbounded size, and the cap above never binds: a cap at half the admission
        # run's size shows what a cap that does bind costs.
        adm = max(results["admission"]["days"][-1]["table_sizes"].values())
        tight = max(1024, adm // 2)
        results["admission+cap/2"] = run_one("admission+cap/2", root, data, days, a, True, tight)
    return results


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows-per-day", type=int, default=150_000)
    p.add_argument("--days", type=int, default=7, help="training days (+ the day after)")
    p.add_argument("--new-id-share", type=float, default=0.3)
    p.add_argument("--model", choices=("deepfm", "lr"), default="deepfm")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--log-every", type=int, default=10, help="steps between memory records")
    p.add_argument(
        "--binding-cap",
        choices=("auto", "always", "never"),
        default="auto",
        help="also run admission + a cap at half the admission run's size, one that binds "
        "(auto: when the cap at half the unbounded size evicted nothing)",
    )
    p.add_argument("--quick", action="store_true", help="3 days x 5,000 rows: seconds")
    p.add_argument("--data", help="data dir (default: under the work dir)")
    p.add_argument("--work", help="work dir for data and runs (default: a temp dir, removed)")
    p.add_argument("--out", help="write every figure to this JSON file")
    p.add_argument("--md", help="write the tables as markdown to this file")
    a = p.parse_args()
    if a.quick:
        a.rows_per_day, a.days = 5_000, 3
    return a


def main() -> None:
    a = _parse()
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    work = a.work or tempfile.mkdtemp(prefix="tnrec-churn-bench-")
    data = a.data or os.path.join(work, "data")
    meta = make_data(data, a.rows_per_day, a.days, a.new_id_share)
    days = list(meta["days"])
    share = one_off_share(data, days)
    print(
        f"data: {a.days} days x {a.rows_per_day:,} rows + the day after, new_id_share "
        f"{a.new_id_share} (columns of >= {meta['config']['churn_min_cardinality']:,} ids); "
        f"{share['keys']:,} distinct keys over the training days: "
        f"{share['one_day_share']:.1%} seen on one day only, {share['once_share']:.1%} seen once, "
        f"{share['refused_share']:.1%} seen < 3 times; optimal AUC of the day after "
        f"{meta['optimal_auc']:.4f}",
        flush=True,
    )
    results = run_all(work, data, days, a)
    base = results["unbounded"]["days"]
    summaries = [summarize(n, r, None if n == "unbounded" else base, a) for n, r in results.items()]
    load_end = os.getloadavg()
    header = (
        f"{a.model}, batch {a.batch_size}, {a.days} days x {a.rows_per_day:,} rows, "
        f"new_id_share {a.new_id_share}, min_show {MIN_SHOW}; load average "
        f"{load_start[0]:.2f} at start, {load_end[0]:.2f} / {load_end[1]:.2f} / "
        f"{load_end[2]:.2f} (1/5/15 min) at end; bench time {time.perf_counter() - t_start:.0f} s"
    )
    text = [
        header,
        "",
        *day_table(results),
        "",
        *summary_table(summaries),
        "",
        *verdicts(summaries),
    ]
    print("\n".join(text))
    if a.md:
        os.makedirs(os.path.dirname(os.path.abspath(a.md)), exist_ok=True)
        with open(a.md, "w", encoding="utf-8") as f:
            f.write("# Churn run (issue 16)\n\n" + "\n".join(text) + "\n")
    if a.out:
        doc = {
            "args": vars(a),
            "data": {**share, "optimal_auc": meta["optimal_auc"]},
            "load_average": {"start": load_start, "end": load_end},
            "results": results,
            "summary": summaries,
        }
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
