"""Async against sync training of DeepFM on W = 2 and 4 workers: samples/s, next-day AUC.

One command, two tables::

    python bench/async_bench.py                 # about 10 minutes on the 2-core machine
    python bench/async_bench.py --quick         # smoke run, under 2 minutes

Data: the project's synthetic Criteo-schema generator (``tnrec.data.synthetic``)
writes one training day of ``--rows`` rows (default 64,000) and the next day
(the generator's test split, as many rows) to Parquet in a temporary
directory, in as many files a day as the least common multiple of the W values
(4 for W = 2 and 4), so every worker reads an equal share of whole files.
Every run trains one epoch of day 1 (``fit`` splits the reader: each of W
workers reads its files) and evaluates on day 2: the next-day AUC is
``evaluate(..., exact_auc=True)`` over all of day 2.

Model: ``tnrec.models.DeepFM`` on ``tn.data.criteo_columns()`` (26 categorical
columns, 13 dense features), dimension 16, MLP ``--hidden`` (default 256-128),
sparse Ftrl and dense Adam as ``bench/synthetic_quality.py`` sets them for the
per-worker batch ``--batch`` (default 512; a sync step trains W of them, an
async step one), the same in both modes (``--async-beta1`` sets the dense
Adam's beta1 of the async runs alone). Every run is a fresh ``torchrun``
launch on 127.0.0.1 (gloo, and torch RPC in async mode), one intra-op thread
per worker; the launch's start-up and the evaluation are outside the figures.

Runs, per W in ``--worlds``:

* ``sync`` (``PsStrategy(mode="sync")``) and ``async`` at each ``k`` in
  ``--staleness`` (``PsStrategy(mode="async", staleness=k)``);
* ``sync, equal updates``: sync mode with ``--batch / W`` rows per worker, so
  each of its steps is one update from ``--batch`` rows, as each async step
  is (the optimizers set for ``--batch``). By the W = 1 contract it trains
  what one worker trains at ``--batch``: async's sequence of updates without
  stale reads. ``ΔAUC (eq)`` is async's AUC against it, ``ΔAUC`` against
  ``sync``;
* the same with a straggler: the last rank sleeps X ms after each of its steps
  (a ``tn.callbacks.Callback``), X = 0.5x and 2x the sync step time measured
  in this W's sync run without a straggler (``--stragglers`` picks which of
  ``none``, ``0.5x``, ``2x`` run; the two sync baselines always run);
* uneven data: rank 0 reads 3x the rows of every other rank (per-rank files cut
  from day 1; the same rows in all), sync and async at each ``k`` of
  ``--uneven-k`` (default 4): the epoch's wall time.

Figures: a worker's *train time* runs from the start of ``fit`` to the end of
its last step with rows (async: when its data runs out, before the epoch's
end waits for the others). *samples/s (others)* = the rows of ranks 0..W-2
(the non-stragglers) / the longest of their train times; *samples/s (all)* =
all rows / the epoch's wall time (the longest ``fit``, its end included);
*ratio* = samples/s (others) / sync's in the same setting (W, straggler).
*max_outstanding* is ``model.ps.max_outstanding``, the most over workers.
Each run records the machine's state (``machine_state.py``): ``others`` is
the cores other processes kept busy during it, ``*`` marks a run taken on a
busy machine, ``--strict`` refuses the figures instead.

Targets (issue 21), printed as PASS/MISS lines: with the 2x straggler, async's
samples/s (others) >= 1.6x sync's; next-day AUC within 0.003 of sync's at
k <= 4, against both sync baselines. On 2 cores, W = 4 runs 4 workers on 2
cores: a worker that sleeps or has finished leaves its core to the others, in
both modes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import tempfile
import time

import numpy as np

from machine_state import MachineState, MachineWatch, add_strict_flag, check_runs, mark
from torchrun import torchrun_command

DIM = 16
RUN_TIMEOUT_S = 900  # one launch; a hang is reported as a failed run
FIELDS = ("rows", "steps", "train_s", "fit_s", "max_outstanding")
AUC_TOLERANCE = 0.003
STRAGGLER_TARGET = 1.6


# --------------------------------------------------------------------------- worker


def _optimizers(batch: int, beta1: float = 0.9):
    """Ftrl and Adam of bench/synthetic_quality.py's DeepFM, for a worker batch of ``batch``;
    ``beta1``: the dense Adam's."""
    from tnrec.optimizer import Adam, Ftrl

    return Ftrl(0.05, beta=4.096 / batch, l1=0.0, l2=40.96 / batch), Adam(0.001, beta1=beta1)


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    import tnrec as tn
    from tnrec.models import DeepFM

    class Straggler(tn.callbacks.Callback):
        """Sleeps ``seconds`` after every step of this worker."""

        def __init__(self, seconds: float) -> None:
            self.seconds = seconds

        def on_train_batch_end(self, step, logs=None):
            time.sleep(self.seconds)

    class Timer(tn.callbacks.Callback):
        """This worker's rows, steps with rows, and the time of its last such step."""

        def __init__(self) -> None:
            self.rows = self.steps = 0
            self.start = self.last = 0.0

        def on_train_begin(self, logs=None):
            self.start = self.last = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            n = int((logs or {}).get("batch_size", 0))
            if n:
                self.rows += n
                self.steps += 1
                self.last = time.perf_counter()

    strategy = tn.distribute.PsStrategy(timeout_s=300, mode=args.mode, staleness=args.k)
    rank, world = strategy.rank, strategy.world_size
    cols = tn.data.criteo_columns()
    beta1 = args.async_beta1 if args.mode == "async" else 0.9
    sparse_opt, dense_opt = _optimizers(args.opt_batch or args.batch, beta1)
    torch.manual_seed(0)
    model = DeepFM(
        cols,
        embedding_dim=DIM,
        hidden_units=tuple(args.hidden),
        sparse_optimizer=sparse_opt,
        dense_optimizer=dense_opt,
    )
    model.compile()
    train = tn.data.read_parquet(args.train.split(","), cols, batch_size=args.batch)
    test = tn.data.read_parquet(args.test.split(","), cols, batch_size=8192)
    timer = Timer()
    cbs = [Straggler(args.sleep_ms / 1000)] if args.sleep_ms > 0 and rank == world - 1 else []
    strategy.barrier()  # every worker starts fit together
    t0 = time.perf_counter()
    model.fit(train, epochs=1, callbacks=[*cbs, timer], verbose=0)
    fit_s = time.perf_counter() - t0
    mine = [
        timer.rows,
        timer.steps,
        timer.last - timer.start,
        fit_s,
        getattr(model.ps, "max_outstanding", -1),
    ]
    gathered = model.ps.all_gather(np.array(mine, np.float64)).reshape(world, len(FIELDS))
    t1 = time.perf_counter()
    ev = model.evaluate(test, verbose=0, exact_auc=True)
    eval_s = time.perf_counter() - t1
    if rank == 0:
        result = {
            "world": world,
            "mode": args.mode,
            "k": args.k if model.ps.asynchronous else 0,
            "asynchronous": bool(model.ps.asynchronous),
            "sleep_ms": args.sleep_ms,
            "batch": args.batch,
            "equal_updates": args.opt_batch not in (0, args.batch),
            "workers": [dict(zip(FIELDS, map(float, row), strict=True)) for row in gathered],
            "auc": float(ev["auc_exact"]),
            "loss": float(ev["loss"]),
            "eval_s": eval_s,
        }
        with open(args.out, "w") as f:
            json.dump(result, f)
    strategy.shutdown()


# --------------------------------------------------------------------------- data


def make_data(root: str, rows: int, worlds: list[int]) -> dict[str, object]:
    """Write day 1 (train), day 2 (test) and per-W uneven files of day 1; return their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tnrec.data import synthetic as S

    files = math.lcm(*worlds)  # every W gets an equal share of whole files
    cfg = S.SyntheticConfig(rows_per_day=rows, num_days=1, test_rows=rows, parts_per_day=files)
    gen = S.generate(root, cfg)
    train = [str(p) for p in gen.train_files[cfg.days[0]]]
    day1 = pa.concat_tables([pq.read_table(p) for p in train])
    uneven = {}
    for w in worlds:  # rank 0: 3 shares, every other rank 1: file r is rank r's
        shares = np.array([3] + [1] * (w - 1))
        edges = np.concatenate([[0], np.cumsum(shares)]) * day1.num_rows // shares.sum()
        d = os.path.join(root, f"uneven{w}")
        os.makedirs(d)
        paths = []
        for r in range(w):
            path = os.path.join(d, f"part-{r:05d}.parquet")
            pq.write_table(day1.slice(int(edges[r]), int(edges[r + 1] - edges[r])), path)
            paths.append(path)
        uneven[w] = paths
    return {
        "train": train,
        "test": [str(p) for p in gen.test_files],
        "uneven": uneven,
        "optimal_auc": gen.optimal_auc,
    }


# --------------------------------------------------------------------------- launcher


def launch(
    a: argparse.Namespace,
    world: int,
    mode: str,
    k: int,
    sleep_ms: float,
    train: list[str],
    test: list[str],
    tmp: str,
    tag: str,
    batch: int | None = None,
) -> dict:
    """Run one configuration on ``world`` workers; return rank 0's JSON and the machine state.

    A run that fails or exceeds ``RUN_TIMEOUT_S`` returns ``{"error": ...}`` with the
    tail of the workers' log.
    """
    out, log = os.path.join(tmp, f"{tag}.json"), os.path.join(tmp, f"{tag}.log")
    cmd = torchrun_command(
        world,
        os.path.abspath(__file__),
        "--worker",
        "--mode",
        mode,
        "--k",
        str(k),
        "--sleep-ms",
        f"{sleep_ms:.3f}",
        "--batch",
        str(batch or a.batch),
        "--opt-batch",
        str(a.batch),
        "--async-beta1",
        str(a.async_beta1),
        "--hidden",
        *map(str, a.hidden),
        "--train",
        ",".join(train),
        "--test",
        ",".join(test),
        "--out",
        out,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    error = None
    with open(log, "w") as lf, MachineWatch() as watch:  # the workers are waited for: own CPU
        proc = subprocess.Popen(
            cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT_S)
            if rc != 0:
                error = f"exit status {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and the workers it started
            proc.wait()
            error = f"no result within {RUN_TIMEOUT_S} s (killed)"
    if error is None and os.path.exists(out):
        with open(out) as f:
            return {**json.load(f), "machine": watch.state, "wall_s": watch.state.wall_s}
    with open(log) as f:
        tail = f.read()[-3000:]
    return {
        "world": world,
        "mode": mode,
        "k": k,
        "sleep_ms": sleep_ms,
        "error": error or "no result file",
        "log_tail": tail,
        "machine": watch.state,
    }


# --------------------------------------------------------------------------- figures


def figures(r: dict) -> dict:
    """Derived figures of one run (module docstring): throughputs, epoch and train times."""
    ws = r["workers"]
    others = ws[:-1] if len(ws) > 1 else ws
    t_others = max(w["train_s"] for w in others)
    epoch_s = max(w["fit_s"] for w in ws)
    rows = sum(w["rows"] for w in ws)
    steps = max(w["steps"] for w in ws)
    return {
        "others_sps": sum(w["rows"] for w in others) / max(t_others, 1e-9),
        "all_sps": rows / max(epoch_s, 1e-9),
        "epoch_s": epoch_s,
        "step_ms": 1000 * max(w["train_s"] for w in ws) / max(steps, 1),
        "max_outstanding": max(int(w["max_outstanding"]) for w in ws),
        "rows": rows,
    }


def _config(r: dict) -> str:
    if r["mode"] == "sync":
        return "sync, equal updates" if r.get("equal_updates") else "sync"
    return f"async k={r['k']}"


def _machine_cell(st: MachineState | None) -> str:
    if st is None:
        return "-"
    return f"{st.other_cores:.2f}{mark(st)} / {st.load1_before:.2f}-{st.load1_after:.2f}"


def _bases(runs: list[dict]) -> tuple[dict[tuple[int, float], dict], dict[int, dict]]:
    """Sync runs by (W, straggler ms), and the equal-updates sync run by W."""
    base: dict[tuple[int, float], dict] = {}
    eq: dict[int, dict] = {}
    for r in runs:
        if r["mode"] == "sync" and "error" not in r:
            if r.get("equal_updates"):
                eq[r["world"]] = r
            else:
                base[(r["world"], r["sleep_ms"])] = r
    return base, eq


def _print_runs(runs: list[dict]) -> None:
    print(
        "| config | W | k | batch per worker | straggler ms | samples/s (others) "
        "| samples/s (all) | ratio vs sync | next-day AUC | ΔAUC vs sync | ΔAUC (eq) "
        "| max_outstanding | machine (other cores / load) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base, eq = _bases(runs)
    for r in runs:
        cfg = _config(r)
        k = r["k"] if r["mode"] != "sync" else 0
        if "error" in r:
            print(
                f"| {cfg} | {r['world']} | {k} | | {r['sleep_ms']:.1f} | FAILED: {r['error']} "
                "| | | | | | | |"
            )
            continue
        f, s = r["fig"], base.get((r["world"], r["sleep_ms"]))
        e = eq.get(r["world"])
        same = r.get("equal_updates") or s is None or s is r
        ratio = f"{f['others_sps'] / s['fig']['others_sps']:.2f}x" if not same else "-"
        dauc = f"{r['auc'] - s['auc']:+.4f}" if s and s is not r else "-"
        deq = f"{r['auc'] - e['auc']:+.4f}" if e and e is not r else "-"
        mo = str(f["max_outstanding"]) if r["asynchronous"] else "-"
        print(
            f"| {cfg} | {r['world']} | {k} | {r.get('batch', '')} | {r['sleep_ms']:.1f} "
            f"| {f['others_sps']:,.0f} | {f['all_sps']:,.0f} | {ratio} | {r['auc']:.4f} "
            f"| {dauc} | {deq} | {mo} | {_machine_cell(r.get('machine'))} |"
        )


def _print_uneven(uneven: list[dict]) -> None:
    print(
        "\nUneven data: rank 0 reads 3x the rows of each other rank; epoch = the longest "
        "fit (wall s); rank 0 / others = their train times (s)\n"
    )
    print(
        "| config | W | k | rows (rank 0 / other) | epoch s | rank 0 train s "
        "| others train s | epoch vs sync | next-day AUC | machine (other cores / load) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ubase = {r["world"]: r for r in uneven if r["mode"] == "sync" and "error" not in r}
    for r in uneven:
        cfg, k = _config(r), (r["k"] if r["mode"] != "sync" else 0)
        if "error" in r:
            print(f"| {cfg} | {r['world']} | {k} | FAILED: {r['error']} | | | | | | |")
            continue
        ws, f = r["workers"], r["fig"]
        s = ubase.get(r["world"])
        vs = f"{f['epoch_s'] / s['fig']['epoch_s']:.2f}x" if s else "-"
        rest = max(w["train_s"] for w in ws[1:])
        print(
            f"| {cfg} | {r['world']} | {k} | {ws[0]['rows']:,.0f} / {ws[1]['rows']:,.0f} "
            f"| {f['epoch_s']:.2f} | {ws[0]['train_s']:.2f} | {rest:.2f} | {vs} "
            f"| {r['auc']:.4f} | {_machine_cell(r.get('machine'))} |"
        )


def target_lines(runs: list[dict]) -> tuple[list[str], bool]:
    """The PASS/MISS lines of the straggler and AUC targets, and whether all passed."""
    base, eq = _bases(runs)
    lines: list[str] = []
    ok = True
    for r in runs:
        if r["mode"] == "sync" or "error" in r or r.get("straggler") != "2x":
            continue
        s = base.get((r["world"], r["sleep_ms"]))
        if s is None:
            continue
        ratio = r["fig"]["others_sps"] / s["fig"]["others_sps"]
        good = ratio >= STRAGGLER_TARGET
        ok &= good
        lines.append(
            f"{'PASS' if good else 'MISS'} W={r['world']} k={r['k']} 2x straggler "
            f"({r['sleep_ms']:.1f} ms): async samples/s of the others {ratio:.2f}x sync's "
            f"(target >= {STRAGGLER_TARGET}x)"
        )
    for r in runs:
        if r["mode"] == "sync" or "error" in r or r["k"] > 4:
            continue
        refs = (
            ("sync", base.get((r["world"], r["sleep_ms"]))),
            ("sync, equal updates", eq.get(r["world"])),
        )
        for name, s in refs:
            if s is None:
                continue
            d = r["auc"] - s["auc"]
            good = abs(d) <= AUC_TOLERANCE
            ok &= good
            lines.append(
                f"{'PASS' if good else 'MISS'} W={r['world']} k={r['k']} straggler "
                f"{r['sleep_ms']:.1f} ms: next-day AUC {r['auc']:.4f} vs {name} {s['auc']:.4f} "
                f"(Δ {d:+.4f}, target |Δ| <= {AUC_TOLERANCE})"
            )
    return lines, ok


def print_tables(a: argparse.Namespace, runs: list[dict], uneven: list[dict], meta: dict) -> bool:
    """Print both tables and the target lines; return whether every target passed."""
    print(
        f"\nDeepFM dim {DIM}, MLP {'-'.join(map(str, a.hidden))}, batch {a.batch} per worker "
        f"(equal updates: {a.batch} per step), synthetic Criteo schema: day 1 {a.rows:,} rows "
        f"(train, 1 epoch), day 2 {a.rows:,} rows (next-day AUC; optimal "
        f"{meta['optimal_auc']:.4f}); 1 thread per worker, {os.cpu_count()} CPUs, "
        f"load average now {os.getloadavg()[0]:.2f}"
    )
    print(
        "others = cores other processes kept busy during the run, then the 1-minute load "
        "average before-after; * = busy machine\n"
    )
    _print_runs(runs)
    if uneven:
        _print_uneven(uneven)
    print()
    lines, ok = target_lines(runs)
    for line in lines:
        print(line)
    for r in [r for r in runs + uneven if "error" in r]:
        ok = False
        print(f"FAILED {_config(r)} W={r['world']} straggler {r['sleep_ms']:.1f} ms: {r['error']}")
    return ok


# --------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worlds", type=int, nargs="+", help="W values (default 2 4; --quick: 2)")
    p.add_argument("--staleness", type=int, nargs="+", help="async k (default 1 4 16; --quick: 4)")
    p.add_argument("--rows", type=int, help="rows of day 1 and of day 2 (default 64000)")
    p.add_argument("--batch", type=int, help="rows per worker and step (default 512)")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128], help="DeepFM's MLP")
    p.add_argument("--quick", action="store_true", help="smoke run: W=2, k=4, 16,000 rows")
    p.add_argument("--uneven-k", type=int, nargs="+", help="async k of the uneven runs (default 4)")
    p.add_argument("--no-uneven", action="store_true", help="skip the uneven-data runs")
    p.add_argument(
        "--stragglers",
        nargs="+",
        choices=("none", "0.5x", "2x"),
        default=["none", "0.5x", "2x"],
        help="the straggler settings to run (default all three)",
    )
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument(
        "--async-beta1",
        type=float,
        default=0.9,
        help="the dense Adam's beta1 in the async runs (sync runs keep 0.9)",
    )
    add_strict_flag(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--mode", "--train", "--test", "--out"):
        p.add_argument(flag, default="", help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--opt-batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--sleep-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a)
        return
    a.worlds = a.worlds or ([2] if a.quick else [2, 4])
    a.staleness = a.staleness or ([4] if a.quick else [1, 4, 16])
    a.rows = a.rows or (16_000 if a.quick else 64_000)
    a.batch = a.batch or 512
    a.uneven_k = a.uneven_k or [4]
    if any(w < 2 for w in a.worlds) or any(k < 1 for k in a.staleness + a.uneven_k):
        raise SystemExit("--worlds must be >= 2 and --staleness >= 1 (k = 0 is sync mode)")
    if any(a.batch % w for w in a.worlds):
        raise SystemExit(f"--batch {a.batch} must be a multiple of every W in --worlds")
    t_start = time.perf_counter()
    runs: list[dict] = []
    uneven: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tnrec-async-bench-") as tmp:
        data = make_data(os.path.join(tmp, "data"), a.rows, a.worlds)
        print(f"data written in {time.perf_counter() - t_start:.0f} s", flush=True)

        def run(
            world: int,
            mode: str,
            k: int,
            sleep_ms: float,
            straggler: str,
            train: list[str],
            into: list[dict],
            batch: int | None = None,
        ) -> dict:
            tag = f"w{world}-{mode}-k{k}-s{straggler}-{len(runs) + len(uneven)}"
            r = launch(a, world, mode, k, sleep_ms, train, data["test"], tmp, tag, batch)
            r["straggler"] = straggler
            if "error" not in r:
                r["fig"] = figures(r)
                print(
                    f"  W={world} {mode} k={k} straggler {sleep_ms:.1f} ms: "
                    f"{r['fig']['others_sps']:,.0f} samples/s (others), AUC {r['auc']:.4f}, "
                    f"run {r['wall_s']:.0f} s",
                    flush=True,
                )
            else:
                print(f"  W={world} {mode} k={k}: FAILED {r['error']}\n{r['log_tail']}", flush=True)
            into.append(r)
            return r

        for world in a.worlds:
            base = run(world, "sync", 0, 0.0, "none", data["train"], runs)
            run(world, "sync", 0, 0.0, "none", data["train"], runs, a.batch // world)
            if "none" in a.stragglers:
                for k in a.staleness:
                    run(world, "async", k, 0.0, "none", data["train"], runs)
            if "error" not in base:
                step_ms = base["fig"]["step_ms"]
                for name, factor in (("0.5x", 0.5), ("2x", 2.0)):
                    if name not in a.stragglers:
                        continue
                    run(world, "sync", 0, factor * step_ms, name, data["train"], runs)
                    for k in a.staleness:
                        run(world, "async", k, factor * step_ms, name, data["train"], runs)
            if not a.no_uneven:
                files = data["uneven"][world]
                run(world, "sync", 0, 0.0, "none", files, uneven)
                for k in a.uneven_k:
                    run(world, "async", k, 0.0, "none", files, uneven)
    states = [
        (f"W={r['world']} {_config(r)} straggler {r['sleep_ms']:.1f} ms", r.get("machine"))
        for r in runs + uneven
    ]
    check_runs(states, a.strict)
    ok = print_tables(a, runs, uneven, data)
    for line in check_runs(states, strict=False):
        print(line)
    print(f"bench time {time.perf_counter() - t_start:.0f} s")
    if a.json:
        dump = {
            "settings": {
                k: getattr(a, k)
                for k in ("worlds", "staleness", "rows", "batch", "hidden", "quick")
            },
            "optimal_auc": data["optimal_auc"],
            "runs": runs,
            "uneven": uneven,
            "all_targets_pass": ok,
        }
        for r in dump["runs"] + dump["uneven"]:
            st = r.get("machine")
            r["machine"] = st.to_dict() if st is not None else None
        with open(a.json, "w") as f:
            json.dump(dump, f, indent=1)


if __name__ == "__main__":
    main()
