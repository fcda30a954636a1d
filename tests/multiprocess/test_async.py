"""Async mode on W workers: every push applied once, the staleness bound, quiescing, failures."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tnrec as tn
from tests.multiprocess import mp_scenarios
from tests.multiprocess.conftest import HERE, free_port
from tests.multiprocess.test_distributed import load, merged_tables

SCRIPT = [f"{HERE}/mp_async.py"]


def run(launch, world, scenario, out_dir, staleness, *args):
    res = launch(world, [scenario, str(out_dir), str(staleness), *map(str, args)], target=SCRIPT)
    return res


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """W = 2, k = 2, rank 1 sleeps 20 ms a step: two epochs on uneven parts, then a save."""
    from tests.multiprocess.conftest import torchrun

    out = tmp_path_factory.mktemp("async")
    res = run(torchrun, 2, "train", out, 2, 0.02, out / "ckpt")
    assert res.returncode == 0, res.stdout + res.stderr
    return out, load(out, "train", 2)


def test_each_worker_stops_when_its_data_ends(trained):
    _, parts = trained
    assert all(bool(p["asynchronous"]) for p in parts)
    # rank 0 has twice the batches of rank 1; each takes its own, two epochs
    assert int(parts[0]["steps"]) == 2 * 2 * 30
    assert int(parts[1]["steps"]) == 2 * 30


def test_staleness_never_exceeds_k(trained):
    _, parts = trained
    for p in parts:
        assert 0 <= int(p["max_outstanding"]) <= 2


def test_every_push_applied_exactly_once(trained):
    """Each key's show is the sum of its occurrences' weights over every worker's data."""
    _, parts = trained
    for table in ("shared", "c"):
        expected: dict[int, float] = {}
        for p in parts:
            for k, v in zip(p[f"occ/{table}/keys"], p[f"occ/{table}/show"], strict=True):
                expected[int(k)] = expected.get(int(k), 0.0) + float(v)
        got = merged_tables(parts, "trained")[table]
        assert sorted(expected) == got["keys"].tolist()
        want = np.array([expected[int(k)] for k in got["keys"]])
        np.testing.assert_allclose(got["show"], want, rtol=1e-5, err_msg=table)
    # every push a worker sent to another owner was applied there: the owners count them
    assert int(parts[0]["pushes_applied"]) > 0 and int(parts[1]["pushes_applied"]) > 0


def test_epoch_end_leaves_every_worker_the_same_dense_model(trained):
    _, parts = trained
    keys = [k for k in parts[0] if k.startswith(("trained/dense/", "opt/"))]
    assert any(k.startswith("opt/exp_avg") for k in keys)
    for k in keys:
        np.testing.assert_array_equal(parts[0][k], parts[1][k], err_msg=k)
    # Adam counted every push of every worker: the model moved from its initial weights
    torch.manual_seed(0)
    fresh = mp_scenarios.ContractModel(mp_scenarios.OPTIMIZERS["adagrad"]())
    w = dict(fresh.named_parameters())["mlp.0.weight"].detach().numpy()
    assert not np.allclose(parts[0]["trained/dense/mlp.0.weight"], w)


def test_async_checkpoint_loads_in_one_sync_process(trained):
    out, parts = trained
    model = mp_scenarios.ContractModel(mp_scenarios.OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    model.load_weights(str(out / "ckpt"))
    want = merged_tables(parts, "trained")
    for tname, table in model.tables.items():
        for array, v in table.rows().items():
            np.testing.assert_array_equal(v, want[tname][array], err_msg=f"{tname} {array}")
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), parts[0][f"trained/dense/{name}"])
    steps = [float(st["step"]) for st in model.optimizer.state.values()]
    np.testing.assert_array_equal(steps, parts[0]["opt/step"])


def test_sync_checkpoint_loads_in_async_mode(launch, tmp_path):
    torch.manual_seed(0)
    model = mp_scenarios.ContractModel(mp_scenarios.OPTIMIZERS["adagrad"]())
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy_from_logits")
    for step in range(12):
        model.train_step(mp_scenarios.global_batch(step))
    model.save_weights(str(tmp_path / "ckpt"), "2024-05-10")
    res = run(launch, 2, "resume", tmp_path, 3, tmp_path / "ckpt")
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "resume", 2)
    loaded = merged_tables(parts, "loaded")
    for tname, table in model.tables.items():
        for array, v in table.rows().items():
            np.testing.assert_array_equal(loaded[tname][array], v, err_msg=f"{tname} {array}")
    for name, p in model.named_parameters():
        for part in parts:
            np.testing.assert_array_equal(part[f"loaded/dense/{name}"], p.detach().numpy())
    steps = [float(st["step"]) for st in model.optimizer.state.values()]
    for part in parts:
        np.testing.assert_array_equal(part["loaded/opt/step"], steps)
        # the epoch's dense steps continue the checkpoint's Adam counts
        assert (part["trained/opt/step"] > part["loaded/opt/step"]).all()
    for k in parts[0]:
        if k.startswith("trained/dense/"):
            np.testing.assert_array_equal(parts[0][k], parts[1][k])


def test_staleness_zero_is_sync_mode(launch, tmp_path):
    res = run(launch, 2, "k0", tmp_path, 0)
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "k0", 2)
    ref = mp_scenarios.contract("adagrad", 0, 1)
    for r in range(2):
        np.testing.assert_allclose(parts[r]["adagrad/loss"], ref["adagrad/loss"], rtol=1e-5)
    ours, want = merged_tables(parts, "adagrad"), merged_tables([ref], "adagrad")
    for tname in want:
        for array, v in want[tname].items():
            np.testing.assert_allclose(ours[tname][array], v, rtol=1e-5, atol=1e-6)


def test_a_worker_without_any_data(launch, tmp_path):
    res = run(launch, 2, "empty", tmp_path, 1)
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "empty", 2)
    assert int(parts[0]["steps"]) == 2 * 20 and int(parts[1]["steps"]) == 0
    for k in parts[0]:
        if k.startswith("trained/dense/"):
            np.testing.assert_array_equal(parts[0][k], parts[1][k])
    assert sum(p["trained/table/c/keys"].shape[0] for p in parts) > 0


def test_a_killed_worker_fails_the_others_with_a_clear_error(tmp_path):
    """Plain processes (torchrun would SIGTERM rank 0 as soon as rank 1 died)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        cmd = [sys.executable, *SCRIPT, "crash", str(tmp_path), "2"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [3, 7], outs
    assert "DistributedError: rank 0/2: async" in outs[0], outs[0]
    assert "with rank 1 failed" in outs[0], outs[0]
