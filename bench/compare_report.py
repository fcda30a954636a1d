"""The table ``bench/compare.py`` prints: figures per (model, implementation) and their ratios."""

from __future__ import annotations

import numpy as np

from compare_impls import IMPLS
from machine_state import MachineState, check_runs, mark


def _fmt_range(v: list[float], scale: float = 1e-3, digits: int = 1) -> str:
    med, lo, hi = (x * scale for x in (float(np.median(v)), min(v), max(v)))
    return f"{med:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _paired(num: list[dict], den: list[dict], key: str) -> list[float]:
    """``num[r][key] / den[r][key]`` for each repeat ``r`` both finished."""
    return [
        x[key] / y[key]
        for x, y in zip(num, den, strict=False)
        if "error" not in x and "error" not in y
    ]


def _fmt_ratio(v: list[float], suffix: str = "") -> str:
    if not v:
        return "-"
    return f"{np.median(v):.2f}{suffix} ({min(v):.2f}-{max(v):.2f})"


def _state(run: dict) -> MachineState | None:
    return MachineState.from_dict(run["machine"]) if "machine" in run else None


def machine_runs(
    results: dict[str, dict[str, list[dict]]], prefix: str = ""
) -> list[tuple[str, MachineState | None]]:
    """``(label, state)`` of every run, the label naming the run and its samples/s."""
    out = []
    for model, by_impl in results.items():
        for impl, runs in by_impl.items():
            for r, run in enumerate(runs):
                fig = (
                    f"{run['samples_per_s'] / 1e6:.3f} M samples/s"
                    if "samples_per_s" in run
                    else "failed"
                )
                out.append((f"{prefix}{model} {impl} r{r}: {fig}", _state(run)))
    return out


def _fmt_machine(runs: list[dict]) -> tuple[str, str, str]:
    """The busy mark, median other cores and highest load average of a row's runs."""
    states = [s for s in map(_state, runs) if s is not None]
    if not states:
        return "", "-", "-"
    busy = "".join(dict.fromkeys(mark(s) for s in states))
    others = float(np.median([s.other_cores for s in states]))
    return busy, f"{others:.2f}", f"{max(s.load1_max for s in states):.1f}"


_PARTS_WHAT = (
    "alternating in one process (the same model, a third pass), ms tnrec / dense-only (excess)"
)


def _fmt_parts(runs: list[dict[str, dict[str, float]]]) -> str:
    """``part tnrec / dense-only (+excess)`` for every part, medians over the repeats'
    :func:`compare_run.alternating_parts`; ``-`` where the dense-only step has no such part."""
    out = []
    for part in runs[0]["tnrec"]:
        t, d, e = (
            float(np.median([r[side][part] for r in runs])) for side in ("tnrec", "dense", "excess")
        )
        dense = f"{d:.2f}" if any(r["dense"][part] for r in runs) else "-"
        out.append(f"{part} {t:.2f} / {dense} ({e:+.2f})")
    return ", ".join(out)


def report(results: dict[str, dict[str, list[dict]]], skipped: str | None) -> str:
    lines = [
        "samples/s in thousands: median (min-max) of the interleaved repeats; step ms: median "
        "step; AUC on the held-out split after one pass (median); peak RSS of the run's process "
        "(MiB, median); the ratios are taken within each repeat (its runs ran one after "
        "another), then the median (min-max) over the repeats; others: cores other processes "
        "kept busy during a run (median of the row's runs); load: the highest 1-minute load "
        "average at a run's start or end; * a run taken while the machine was busy (below)",
        "",
        "model   impl      ksamples/s                step ms  AUC     collisions  peak RSS  "
        "vs tnrec            step/dense        others  load",
        "------  --------  ------------------------  -------  ------  ----------  --------  "
        "------------------  ----------------  ------  ----",
    ]
    for model, by_impl in results.items():
        tn_runs = by_impl.get("tnrec", [])
        dense_runs = by_impl.get("dense", [])
        for impl in IMPLS:
            runs = by_impl.get(impl)
            if runs is None:
                if impl == "torchrec" and skipped:
                    lines.append(f"{model:6}  {impl:8}  skipped: {skipped}")
                continue
            ok = [r for r in runs if "error" not in r]
            if not ok:
                lines.append(f"{model:6}  {impl:8}  FAILED: {runs[0]['error'].splitlines()[-1]}")
                continue
            sps = [r["samples_per_s"] for r in ok]
            ms = float(np.median([r["step_ms_median"] for r in ok]))
            auc = f"{np.median([r['auc'] for r in ok]):.4f}" if "auc" in ok[0] else "-"
            coll = f"{100 * ok[0]['collision_rate']:.1f}%" if "collision_rate" in ok[0] else "0"
            rss = float(np.median([r["peak_rss_mib"] for r in ok]))
            ratio = _fmt_ratio(_paired(tn_runs, runs, "samples_per_s"), "x")
            over = (
                _fmt_ratio(_paired(runs, dense_runs, "step_ms_median")) if impl != "dense" else "-"
            )
            busy, others, load = _fmt_machine(runs)
            lines.append(
                f"{model:6}  {impl:8}  {_fmt_range(sps) + busy:24}  {ms:7.2f}  {auc:6}  "
                f"{coll:>10}  {rss:8.0f}  {ratio:>18}  {over:>16}  {others:>6}  {load:>4}"
            )
    lines.append("")
    lines.append("vs tnrec = tnrec samples/s / this row's samples/s (> 1: tnrec faster)")
    lines += check_runs(machine_runs(results), strict=False)
    for model, by_impl in results.items():
        for r in by_impl.get("tnrec", []):
            if "split_ms" in r:
                sp = r["split_ms"]
                lines.append(
                    f"tnrec {model} step split (ms, median of the last steps): "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sp.items())
                    + (f"; prefill {r['prefill_s']:.1f} s" if "prefill_s" in r else "")
                )
                break
        for key, what in (
            ("alternating_ms", "a fresh model, one pass"),
            ("alternating_again_ms", "the same model, a second pass: no row created"),
            ("alternating_fit_ms", "fit with its input pipeline, a fresh model, one pass"),
            ("alternating_fit_again_ms", "fit with its input pipeline, a second pass"),
            (
                "alternating_fit_nopipe_ms",
                "fit without the input pipeline, a fresh model, one pass",
            ),
            ("alternating_fit_nopipe_again_ms", "fit without the input pipeline, a second pass"),
        ):
            alt = [r[key] for r in by_impl.get("tnrec", []) if key in r]
            if alt:
                lines.append(
                    f"tnrec {model} step / dense-only step, alternating in one process "
                    f"({what}): {_fmt_ratio([x['ratio'] for x in alt])}; ms "
                    f"{np.median([x['tnrec'] for x in alt]):.2f} / "
                    f"{np.median([x['dense'] for x in alt]):.2f}"
                )
        parts = [
            r["alternating_parts_ms"]
            for r in by_impl.get("tnrec", [])
            if "alternating_parts_ms" in r
        ]
        if parts:
            lines.append(
                f"tnrec {model} step over the dense-only step by part, {_PARTS_WHAT}: "
                + _fmt_parts(parts)
            )
    return "\n".join(lines)
