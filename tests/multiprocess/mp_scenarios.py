"""Scenarios run by every worker under torchrun, and in-process as the 1-worker reference.

Run as ``torchrun --nproc-per-node W mp_scenarios.py SCENARIO OUT_DIR``; each
worker writes ``OUT_DIR/<scenario>-rank<r>.npz``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import torch

import tnrec as tn
import tnrec.steps
from tnrec.data.batch import Batch, Jagged
from tnrec.table import AdaGrad, Adam, Ftrl

fc = tn.feature_column
STEPS = 50
OPTIMIZERS = {
    "adagrad": lambda: AdaGrad(0.1, initial_g2sum=0.1),
    "adam": lambda: Adam(0.01),
    "ftrl": lambda: Ftrl(0.1, l1=0.0, l2=0.1),
}


class ContractModel(tn.Model):
    """Two tables of different dims; table "shared" serves two layers; a mean column."""

    def __init__(self, opt):
        super().__init__()
        user, item, tags = (fc.category_column(k) for k in ("user", "item", "tags"))
        self.a = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4), fc.embedding_column(tags, 4, combiner="mean")],
            opt,
            table="shared",
            output="concat",
        )
        self.b = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(item, 4)], opt, table="shared", output="concat"
        )
        self.c = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 2), fc.embedding_column(item, 2)], opt, output="concat"
        )
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(18, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["a"], pooled["b"], pooled["c"], dense], 1))


def _jagged(lists):
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    keys = np.array([k for x in lists for k in x], np.int64)
    return Jagged(keys, offsets)


def global_batch(step: int) -> Batch:
    """The global batch of ``step``: 6-40 rows, keys from small pools (shared across workers)."""
    rng = np.random.default_rng(1000 + step)
    B = int(rng.integers(6, 41))
    users = rng.integers(0, 25, B) * 7919 - 90_000
    items = rng.integers(0, 15, B) + (1 << 40)
    tags = [list(rng.integers(0, 12, rng.integers(0, 4))) for _ in range(B)]
    dense = rng.normal(size=(B, 2)).astype(np.float32)
    y = ((users % 3 == 0) ^ (items % 2 == 0)).astype(np.float32)
    return Batch(
        sparse={
            "user": _jagged([[u] for u in users]),
            "item": _jagged([[i] for i in items]),
            "tags": _jagged(tags),
        },
        dense=dense,
        dense_names=("d0", "d1"),
        labels=y[:, None],
        label_names=("label",),
        weights=rng.uniform(0.5, 2.0, B).astype(np.float32),
        row_ids=np.arange(step * 100, step * 100 + B, dtype=np.int64),
    )


def worker_slice(batch: Batch, step: int, rank: int, world: int) -> Batch:
    """Contiguous, unequal slices by rank; every 5th step rank 0 gets an empty slice."""
    rng = np.random.default_rng(step)
    cuts = np.sort(rng.integers(0, batch.size + 1, world - 1))
    if step % 5 == 0 and world > 1:
        cuts[0] = 0
    bounds = [0, *cuts.tolist(), batch.size]
    return batch.slice(bounds[rank], bounds[rank + 1])


class CvmFrozenModel(tn.Model):
    """Table "shared": a cvm layer and a frozen cvm layer ("tags" in both); table "c" trains."""

    def __init__(self, opt):
        super().__init__()
        user, item, tags = (fc.category_column(k) for k in ("user", "item", "tags"))
        self.a = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4), fc.embedding_column(tags, 4, combiner="mean")],
            opt,
            table="shared",
            output="concat",
            cvm=True,
        )
        self.f = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(item, 4), fc.embedding_column(tags, 4)],
            opt,
            table="shared",
            output="concat",
            cvm=True,
            trainable=False,
        )
        self.c = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 2), fc.embedding_column(item, 2)], opt, output="concat"
        )
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(30, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
        )

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["a"], pooled["f"], pooled["c"], dense], 1))


class GlobalLosses(tn.callbacks.Callback):
    """Every step's loss summed over the workers (a collective each step)."""

    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, step, logs=None):
        loss = (logs or {}).get("loss", 0.0)
        self.losses.append(float(self.model.ps.all_reduce_sum(np.array([loss]))[0]))


def contract(
    opt_name: str, rank: int, world: int, make: type[tn.Model] = ContractModel
) -> dict[str, np.ndarray]:
    """Train 50 steps on this worker's slices; return losses, dense params and owned rows.

    AdaGrad trains with a loop of ``train_step`` calls, Adam and FTRL with the
    pipelined ``fit`` over the same slices (so W workers pipelined train as 1).
    """
    torch.manual_seed(0)
    model = make(OPTIMIZERS[opt_name]())
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    slices = [worker_slice(global_batch(step), step, rank, world) for step in range(STEPS)]
    if opt_name == "adagrad":
        losses = []
        for batch in slices:
            logs = model.train_step(batch)
            losses.append(float(model.ps.all_reduce_sum(np.array([logs.get("loss", 0.0)]))[0]))
    else:
        record = GlobalLosses()
        model.fit(slices, callbacks=[record], verbose=0, pipeline=True)
        losses = record.losses
    out = {f"{opt_name}/loss": np.array(losses)}
    dense = getattr(model.ps, "dense", None)  # the sharded PS's dense collectives
    out[f"{opt_name}/dense_groups"] = np.array(sorted(dense.groups()) if dense else [], dtype=str)
    for name, p in model.named_parameters():
        out[f"{opt_name}/dense/{name}"] = p.detach().numpy()
    for tname, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"{opt_name}/table/{tname}/{k}"] = v
    return out


def run_contract(rank: int, world: int) -> dict[str, np.ndarray]:
    out = {}
    for opt_name in OPTIMIZERS:
        out.update(contract(opt_name, rank, world))
    return out


def run_cvm_frozen(rank: int, world: int) -> dict[str, np.ndarray]:
    out = {}
    for opt_name in OPTIMIZERS:
        out.update(contract(opt_name, rank, world, CvmFrozenModel))
    return out


def run_pipeline(rank: int, world: int) -> dict[str, np.ndarray]:
    """Fit unpipelined, then pipelined, on uneven parts (rank 0 runs out first): the same bits."""
    n = 8 if rank == 0 else 14  # rank 0 joins the last 6 steps of each epoch with empty batches
    part = [worker_slice(global_batch(step), step, rank, world) for step in range(n)]
    out = {}
    for prefix, pipeline in (("inline", False), ("pipelined", True)):
        torch.manual_seed(0)
        model = CvmFrozenModel(OPTIMIZERS["adam"]())
        model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
        record = GlobalLosses()
        model.fit(part, epochs=2, callbacks=[record], verbose=0, pipeline=pipeline)
        out[f"{prefix}/loss"] = np.array(record.losses)
        out[f"{prefix}/route_s"] = np.array(model.input_seconds["route"])
        for name, p in model.named_parameters():
            out[f"{prefix}/dense/{name}"] = p.detach().numpy()
        for tname, table in model.tables.items():
            for k, v in table.rows().items():
                out[f"{prefix}/table/{tname}/{k}"] = v
    out["input_threads"] = np.array([t.name == "tnrec-input" for t in threading.enumerate()])
    return out


def run_timeout(rank: int, world: int) -> dict[str, np.ndarray]:
    """Rank 1 never joins the second collective; rank 0 must fail with a clear error."""
    strategy = tn.distribute.current_strategy()
    ps = tn.ps.ShardedPS({}, strategy.comm)
    ps.all_reduce_sum(np.ones(1))
    if rank == 1:
        time.sleep(20)
        return {}
    try:
        ps.all_reduce_sum(np.ones(1))
    except tn.errors.DistributedError as e:
        print(f"DistributedError: {e}", flush=True)
        sys.exit(3)
    return {}


def run_crash(rank: int, world: int) -> dict[str, np.ndarray]:
    """Rank 1 dies in step 3; every worker must exit non-zero."""
    torch.manual_seed(0)
    model = ContractModel(AdaGrad(0.1))
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    for step in range(10):
        if rank == 1 and step == 3:
            os._exit(7)
        model.train_step(worker_slice(global_batch(step), step, rank, world))
    return {}


def write_uneven_files(data_dir: str) -> list[str]:
    """Three Parquet files of 60, 0 and 1 rows (worker r of 3 reads file r)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for i, n in enumerate([60, 0, 1]):
        rng = np.random.default_rng(i)
        table = pa.table(
            {
                "user": pa.array((rng.integers(0, 25, n) * 7919 - 90_000).tolist(), pa.int64()),
                "item": pa.array((rng.integers(0, 15, n) + (1 << 40)).tolist(), pa.int64()),
                "tags": pa.array(
                    [rng.integers(0, 12, rng.integers(0, 4)).tolist() for _ in range(n)],
                    pa.list_(pa.int64()),
                ),
                "d0": pa.array(rng.normal(size=n), pa.float64()),
                "d1": pa.array(rng.normal(size=n), pa.float64()),
                "label": pa.array(rng.integers(0, 2, n).astype(float), pa.float64()),
            }
        )
        path = os.path.join(data_dir, f"part-{i}.parquet")
        pq.write_table(table, path)
        paths.append(path)
    return paths


def uneven_reader(data_dir: str):
    cols = [fc.category_column(k) for k in ("user", "item", "tags")]
    cols += [fc.numeric_column("d0"), fc.numeric_column("d1")]
    files = sorted(
        os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".parquet")
    )
    return tn.data.read_parquet(files, cols, batch_size=8, prefetch=0)


class RowCounting(ContractModel):
    def __init__(self, opt):
        super().__init__(opt)
        self.trained_rows: list[np.ndarray] = []

    def train_step(self, batch):
        self.trained_rows.append(batch.row_ids)
        return super().train_step(batch)


def run_uneven(rank: int, world: int, data_dir: str) -> dict[str, np.ndarray]:
    """Train 10 identical steps; evaluate, predict and fit one epoch on uneven files."""
    torch.manual_seed(0)
    model = RowCounting(AdaGrad(0.1))
    model.compile(
        tn.optimizer.Adam(0.01),
        loss="binary_crossentropy_from_logits",
        metrics=["auc", "logloss", "ctr", "pctr", "copc"],
    )
    for step in range(10):
        model.train_step(worker_slice(global_batch(step), step, rank, world))
    model.trained_rows.clear()
    logs = model.evaluate(uneven_reader(data_dir), verbose=0, exact_auc=True)
    pred = model.predict(uneven_reader(data_dir))
    model.fit(uneven_reader(data_dir), epochs=1, verbose=0)
    out = {f"eval/{k}": np.array(v) for k, v in logs.items()}
    out["predict/row_id"] = pred["row_id"]
    out["predict/prediction"] = pred["prediction"]
    out["trained_rows"] = np.concatenate(model.trained_rows)
    return out


def _dump(model, prefix: str) -> dict[str, np.ndarray]:
    out = {
        f"{prefix}/prediction": model.predict([global_batch(100 + i) for i in range(3)])[
            "prediction"
        ]
    }
    for tname, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"{prefix}/table/{tname}/{k}"] = v
    return out


def _reshard_model() -> ContractModel:
    torch.manual_seed(0)
    model = ContractModel(AdaGrad(0.1))
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    return model


def run_reshard(rank: int, world: int, ckpt_in: str, ckpt_out: str) -> dict[str, np.ndarray]:
    """Load a checkpoint written by another number of workers; train and save one of our own."""
    out = {}
    if ckpt_in != "-":
        model = _reshard_model()
        model.load_weights(ckpt_in)
        out.update(_dump(model, "loaded"))
    if ckpt_out != "-":
        model = _reshard_model()
        for step in range(10):
            model.train_step(worker_slice(global_batch(step), step, rank, world))
        model.save_weights(ckpt_out, "d0")
        out.update(_dump(model, "saved"))
    return out


def run_daily(rank: int, world: int, data_dir: str, model_dir: str) -> dict[str, np.ndarray]:
    """Two days of the daily cycle on uneven files: what each day reports."""
    from tnrec.daily import train_days

    model = _reshard_model()
    days = [(dt, lambda: uneven_reader(data_dir)) for dt in ("2024-05-10", "2024-05-11")]
    reports = train_days(model, days, model_dir)
    return {
        "keys_created": np.array([r.keys_created for r in reports]),
        "rows": np.array([r.rows_trained for r in reports]),
        "sizes": np.array([sum(r.table_sizes.values()) for r in reports]),
    }


class AdmissionModel(tn.Model):
    """One table behind admission (min_show 2, a small sketch) and a row cap of 1024."""

    def __init__(self):
        super().__init__()
        user, item = fc.category_column("user"), fc.category_column("item")
        self.e = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4), fc.embedding_column(item, 4)],
            AdaGrad(0.1, initial_g2sum=0.1),
            output="concat",
            admission=tn.table.AdmissionPolicy(min_show=2.0, sketch_bytes=1024 * 2 * 4 * 4),
            policy=tn.table.EvictionPolicy(max_rows=1024, low_water=0.5),
        )
        self.mlp = torch.nn.Linear(10, 1)

    def forward_dense(self, pooled, dense):
        return self.mlp(torch.cat([pooled["e"], dense], 1))


def admission_batch(step: int) -> Batch:
    """Batches of 20-80 rows; users and items Zipf-like over pools of 3000 and 800 ids."""
    b = global_batch(step)
    rng = np.random.default_rng(5000 + step)
    users = (rng.zipf(1.3, b.size) % 3000) * 7919 - 90_000
    items = (rng.zipf(1.2, b.size) % 800) + (1 << 40)
    b.sparse["user"] = _jagged([[u] for u in users])
    b.sparse["item"] = _jagged([[i] for i in items])
    del b.sparse["tags"]
    return b


PROBE = np.concatenate([np.arange(3000) * 7919 - 90_000, np.arange(800) + (1 << 40)]).astype(
    np.int64
)


def run_admission(rank: int, world: int, ckpt: str) -> dict[str, np.ndarray]:
    """Train with admission and a row cap on uneven slices; save; what a W=1 run must match."""
    torch.manual_seed(0)
    model = AdmissionModel()
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    losses = []
    for step in range(40):
        logs = model.train_step(worker_slice(admission_batch(step), step, rank, world))
        losses.append(float(model.ps.all_reduce_sum(np.array([logs.get("loss", 0.0)]))[0]))
    table = model.tables["e"]
    counters = np.array([table.counters[k] for k in sorted(table.counters)], np.float64)
    mine = model.ps.owns(PROBE) if world > 1 else np.ones(PROBE.shape[0], bool)
    out = {
        "loss": np.array(losses),
        "counters": model.ps.all_reduce_sum(counters),
        "sketch_keys": PROBE[mine],
        "sketch": table.sketch.estimate(PROBE[mine]),
        "rows": np.array([len(table)]),
    }
    for k, v in table.rows().items():
        out[f"admission/table/e/{k}"] = v
    if ckpt != "-":
        model.save_weights(ckpt, "d0")
    return out


def load_admission(ckpt: str) -> dict[str, np.ndarray]:
    """One worker loads a checkpoint of the admission model: its sketch and rows."""
    model = AdmissionModel()
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    model.load_weights(ckpt)
    table = model.tables["e"]
    return {"sketch": table.sketch.estimate(PROBE), "keys": table.keys()}


def run_schedule(rank: int, world: int) -> dict[str, np.ndarray]:
    """``fit`` 20 steps of this worker's slices under a warm-up then exponential decay."""
    from tnrec.callbacks import Callback, LearningRateScheduler
    from tnrec.schedules import ExponentialDecay, WarmUp

    class Rates(Callback):
        def __init__(self) -> None:
            self.seen: list[list[float]] = []

        def on_train_batch_end(self, step, logs=None):
            rates = [t.learning_rate for _, t in sorted(self.model.tables.items())]
            self.seen.append([self.model.optimizer.param_groups[0]["lr"], *rates])

    torch.manual_seed(0)
    model = ContractModel(AdaGrad(0.1, initial_g2sum=0.1))
    model.compile(tn.optimizer.Adam(learning_rate=0.01), loss="binary_crossentropy_from_logits")
    part = [worker_slice(global_batch(step), step, rank, world) for step in range(20)]
    schedule = LearningRateScheduler(WarmUp(5, 0.2, then=ExponentialDecay(3, 0.7)))
    rates = Rates()
    model.fit(part, callbacks=[schedule, rates], verbose=0)
    out = {"schedule/rates": np.array(rates.seen)}
    for name, p in model.named_parameters():
        out[f"schedule/dense/{name}"] = p.detach().numpy()
    for tname, table in model.tables.items():
        for k, v in table.rows().items():
            out[f"schedule/table/{tname}/{k}"] = v
    return out


SCENARIOS = {
    "contract": run_contract,
    "contract_dense_gloo": run_contract,  # the same, the dense part on a second gloo group
    "contract_push_beside": run_contract,  # the same, each push beside the dense step
    "cvm_frozen": run_cvm_frozen,
    "pipeline": run_pipeline,
    "timeout": run_timeout,
    "crash": run_crash,
    "schedule": run_schedule,
}


def main() -> None:
    scenario, out_dir = sys.argv[1], sys.argv[2]
    timeout_s = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    torch.set_num_threads(1)
    dense_backend = "gloo" if scenario == "contract_dense_gloo" else None
    if scenario == "contract_push_beside":
        tnrec.steps.PUSH_BESIDE_DENSE_STEP = True  # the sparse exchange from the push thread
    strategy = tn.distribute.PsStrategy(timeout_s=timeout_s, dense_backend=dense_backend)
    if scenario == "uneven":
        out = run_uneven(strategy.rank, strategy.world_size, sys.argv[4])
    elif scenario == "daily":
        out = run_daily(strategy.rank, strategy.world_size, sys.argv[4], sys.argv[5])
    elif scenario == "admission":
        out = run_admission(strategy.rank, strategy.world_size, sys.argv[4])
    elif scenario == "reshard":
        out = run_reshard(strategy.rank, strategy.world_size, sys.argv[4], sys.argv[5])
    else:
        out = SCENARIOS[scenario](strategy.rank, strategy.world_size)
    np.savez(os.path.join(out_dir, f"{scenario}-rank{strategy.rank}.npz"), **out)
    strategy.shutdown()
    with open(os.path.join(out_dir, f"{scenario}-threads-rank{strategy.rank}.txt"), "w") as f:
        f.write("\n".join(native_threads()))


def native_threads() -> list[str]:
    """The names of this process's OS threads (Gloo's are ``gloo_*`` and ``pt_gloo_*``)."""
    tasks = "/proc/self/task"
    names = []
    for tid in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, tid, "comm")) as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended while listing
            pass
    return sorted(names)


if __name__ == "__main__":
    main()
