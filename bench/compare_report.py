"""The table ``bench/compare.py`` prints: figures per (model, implementation) and their ratios."""

from __future__ import annotations

import numpy as np

from compare_impls import IMPLS


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


def report(results: dict[str, dict[str, list[dict]]], skipped: str | None) -> str:
    lines = [
        "samples/s in thousands: median (min-max) of the interleaved repeats; step ms: median "
        "step; AUC on the held-out split after one pass (median); peak RSS of the run's process "
        "(MiB, median); the ratios are taken within each repeat (its runs ran one after "
        "another), then the median (min-max) over the repeats",
        "",
        "model   impl      ksamples/s               step ms  AUC     collisions  peak RSS  "
        "vs tnrec            step/dense",
        "------  --------  -----------------------  -------  ------  ----------  --------  "
        "------------------  ----------------",
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
            lines.append(
                f"{model:6}  {impl:8}  {_fmt_range(sps):23}  {ms:7.2f}  {auc:6}  {coll:>10}  "
                f"{rss:8.0f}  {ratio:>18}  {over:>16}"
            )
    lines.append("")
    lines.append("vs tnrec = tnrec samples/s / this row's samples/s (> 1: tnrec faster)")
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
        alt = [r["alternating_ms"] for r in by_impl.get("tnrec", []) if "alternating_ms" in r]
        if alt:
            ratios = [x["ratio"] for x in alt]
            lines.append(
                f"tnrec {model} step / dense-only step, alternating in one process "
                f"(a fresh model, one pass): {_fmt_ratio(ratios)}; ms "
                f"{np.median([x['tnrec'] for x in alt]):.2f} / "
                f"{np.median([x['dense'] for x in alt]):.2f}"
            )
    return "\n".join(lines)
