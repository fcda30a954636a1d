"""Serving figures of an export: sizes, load time after `import torch`, rows/s at batch 1 and 1024.

One command, one table::

    python bench/serving_bench.py                 # about a minute on the 2-core machine
    python bench/serving_bench.py --rows 100000 --model deepfm

It trains a zoo model for one epoch on synthetic Criteo-schema data
(``tnrec.data.synthetic``), exports it, and in a fresh process measures: the
time to ``Predictor(path)`` after ``import torch`` (dictionaries memory-mapped,
sha256 verified or not), and ``predict`` rows/s on raw rows (a pyarrow Table)
at batch 1 and 1024 -- hashing, dictionary lookup, pooling and the dense
graph, 1 torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MEASURE = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
torch.set_num_threads(1)
t1 = time.perf_counter()
from tnrec.serving import Predictor
import pyarrow.parquet as pq
t2 = time.perf_counter()
path, data, verify = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
t3 = time.perf_counter()
p = Predictor(path, verify=verify)
t4 = time.perf_counter()
table = pq.read_table(data)
out = {"import_torch_s": t1 - t0, "import_tnrec_s": t2 - t1, "load_s": t4 - t3}
for batch in (1, 1024):
    p.predict(table.slice(0, batch))  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        p.predict(table.slice((n * batch) % (table.num_rows - batch), batch))
        n += 1
    out[f"rows_per_s_{batch}"] = n * batch / (time.perf_counter() - start)
    out[f"ms_per_call_{batch}"] = 1000 * (time.perf_counter() - start) / n
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--model", default="deepfm", choices=["lr", "widedeep", "deepfm", "dcn"])
    args = p.parse_args()
    import torch

    import tnrec as tn
    from tnrec.data.synthetic import SyntheticConfig, generate
    from tnrec.models import build

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        gen = generate(os.path.join(d, "data"), SyntheticConfig(rows_per_day=args.rows, num_days=1))
        cols = tn.data.criteo_columns()
        torch.manual_seed(0)
        model = build(args.model, cols)
        model.compile()
        files = [str(f) for day in gen.days for f in gen.train_files[day]]
        model.fit(tn.data.read_parquet(files, cols, batch_size=4096), verbose=0)
        path = os.path.join(d, "export")
        t0 = time.perf_counter()
        model.export(path)
        export_s = time.perf_counter() - t0
        sizes = {}
        for root, _, files in os.walk(path):
            for f in files:
                rel = os.path.relpath(os.path.join(root, f), path)
                sizes[rel] = os.path.getsize(os.path.join(root, f))
        manifest = json.load(open(os.path.join(path, "manifest.json")))
        res = {}
        for verify in ("1", "0"):
            out = subprocess.run(
                [sys.executable, "-c", MEASURE, path, str(gen.test_files[0]), verify],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
            )
            res[verify] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"{args.model}, trained on {args.rows:,} synthetic rows; export written in "
        f"{export_s:.1f} s; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'file':<36} {'MB':>8}")
    for name in sorted(sizes):
        print(f"{name:<36} {sizes[name] / 1e6:>8.2f}")
    keys = {t: doc["count"] for t, doc in manifest["tables"].items()}
    print(f"{'total':<36} {sum(sizes.values()) / 1e6:>8.2f}   keys: {keys}")
    r = res["1"]
    print(
        f"import torch {r['import_torch_s']:.2f} s, "
        f"then import tnrec.serving {r['import_tnrec_s']:.2f} s"
    )
    print(
        f"Predictor(path) after the imports: {res['1']['load_s']:.3f} s verifying sha256, "
        f"{res['0']['load_s']:.3f} s without"
    )
    print(f"{'batch':>6} {'rows/s':>10} {'ms/call':>8}")
    for b in (1, 1024):
        print(f"{b:>6} {r[f'rows_per_s_{b}']:>10,.0f} {r[f'ms_per_call_{b}']:>8.2f}")


if __name__ == "__main__":
    main()
