"""W workers ≡ 1 worker for batch normalisation (sync_freq=1), PCGrad and a position bias; with
sync_freq > 1 every worker saves the same, global statistics."""

import os

import numpy as np
import pytest
import torch

from tests.multiprocess import mp_dense_parity as mp
from tests.multiprocess.test_distributed import load, merged_tables
from tnrec.layers.normalization import COUNT

WORLD = 2


@pytest.fixture(scope="module")
def reference():
    out = mp.batch_norm(0, 1, 1, "-")
    out.update(mp.pcgrad(0, 1, True))
    out.update(mp.pcgrad(0, 1, False))
    out.update(mp.position_bias(0, 1))
    return out


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    from tests.multiprocess.conftest import torchrun

    out, ckpt = tmp_path_factory.mktemp("dense"), tmp_path_factory.mktemp("ckpt")
    res = torchrun(WORLD, [str(out), str(ckpt)], target=[mp.__file__])
    assert res.returncode == 0, res.stdout + res.stderr
    return load(out, "dense", WORLD), str(ckpt)


def check_parity(parts, reference, prefix):
    for k, v in reference.items():
        if not k.startswith(prefix + "/") or "/table/" in k:
            continue
        for r, part in enumerate(parts):
            np.testing.assert_allclose(part[k], v, rtol=1e-5, atol=1e-6, err_msg=f"rank {r} {k}")
    ours, ones = merged_tables(parts, prefix), merged_tables([reference], prefix)
    assert sorted(ours) == sorted(ones) == ["a", "b"]
    for tname, arrays in ones.items():
        np.testing.assert_array_equal(ours[tname]["keys"], arrays["keys"])
        for a, v in arrays.items():
            np.testing.assert_allclose(ours[tname][a], v, rtol=1e-5, atol=1e-6, err_msg=tname + a)


def test_batch_norm_synchronized_every_step_trains_what_one_worker_trains(parts, reference):
    check_parity(parts[0], reference, "bn1")
    totals = [p["bn1/buffer/bn.totals"] for p in parts[0]]
    np.testing.assert_array_equal(totals[0], totals[1])  # the same bits on every worker
    rows = sum(mp.global_batch(s).size for s in range(mp.STEPS))
    assert rows > 200 and totals[0][COUNT].max() < rows  # the cap froze the count


def test_every_worker_saves_the_global_statistics(parts):
    from tests.multiprocess.mp_dense_parity import BNModel

    got, ckpt = parts
    saved = [{k: v for k, v in p.items() if k.startswith("bn4/saved/")} for p in got]
    for k, v in saved[0].items():
        np.testing.assert_array_equal(saved[1][k], v, err_msg=k)
    local = [p["bn4/buffer/bn.local"] for p in got]
    assert not np.array_equal(local[0], local[1])  # before the save each held its own view
    model = BNModel(4)
    model.compile(torch.optim.SGD(model.parameters(), 0.1), loss="binary_crossentropy_from_logits")
    model.load_weights(ckpt)
    for name, b in model.bn.named_buffers():
        np.testing.assert_array_equal(b.numpy(), saved[0][f"bn4/saved/{name}"], err_msg=name)
    assert os.path.isdir(ckpt)


def test_pcgrad_trains_what_one_worker_trains(parts, reference):
    check_parity(parts[0], reference, "pcgrad")
    projected = reference["pcgrad/dense/trunk.0.weight"]
    plain = reference["plain/dense/trunk.0.weight"]
    assert np.abs(projected - plain).max() > 1e-4  # the heads conflicted: PCGrad changed the step


def test_a_position_bias_trains_what_one_worker_trains(parts, reference):
    check_parity(parts[0], reference, "position")
    last = reference["position/dense/position.tower.2.weight"]
    assert np.abs(last).max() > 0  # it started at 0: the bias trained
