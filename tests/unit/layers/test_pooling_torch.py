"""pool_torch: the torch-ops pooling (a GPU's) against the numba kernels.

On the CPU everywhere; on CUDA too where ``torch.cuda.is_available()``.
"""

import numpy as np
import pytest
import torch

from tnrec.layers import pooling
from tnrec.layers.pooling import bag_scales, pool, pool_torch

# Two columns (C = 2) of three rows (B = 3); bag c*B + b holds virtual ids:
#   column 0:  row 0: [0, 1]   row 1: []    row 2: [2]
#   column 1:  row 0: [1]      row 1: [0, 0, 2]   row 2: []
ROWS = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]], np.float32)  # [U=3, D=2]
VIDS = np.array([0, 1, 2, 1, 0, 0, 2], np.int64)  # [N=7]
OFFSETS = np.array([0, 2, 2, 3, 4, 7, 7], np.int64)  # [C*B + 1]

COMBINERS = [pytest.param(c, id=c) for c in ("sum", "mean", "sqrtn")]
LAYOUTS = [pytest.param(0, id="bags"), pytest.param(1, id="concat")]
#: Where the torch ops run: the CPU, and CUDA where this machine has it.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def both(E0, vids, offsets, scales, B, concat, grad_seed=0, device="cpu"):
    """Pool with each implementation; return ``(out, E.grad)`` of numba, then of torch ops
    (on ``device``)."""
    results = []
    for torch_ops in (False, True):
        E = E0.clone().to(device if torch_ops else "cpu").requires_grad_(True)
        out = pool(E, vids, offsets, scales, B, concat, torch_ops=torch_ops)
        assert out.device == E.device
        g = torch.from_numpy(np.random.default_rng(grad_seed).normal(size=out.shape))
        (out * g.float().to(E.device)).sum().backward()
        results.append((out.detach().cpu().numpy(), E.grad.cpu().numpy()))
    return results


def test_pool_torch_sums_each_bag_times_its_scale():
    scales = bag_scales(np.diff(OFFSETS), "mean")
    out = pool_torch(torch.from_numpy(ROWS), VIDS, OFFSETS, scales, 3)  # [C*B, D]
    expected = [[5.5, 11], [0, 0], [100, 200], [10, 20], [34, 68], [0, 0]]
    np.testing.assert_allclose(out.numpy(), np.array(expected, np.float32), rtol=1e-6)
    concat = pool_torch(torch.from_numpy(ROWS), VIDS, OFFSETS, scales, 3, 2)  # [B, C*D]
    np.testing.assert_allclose(
        concat.numpy(), [[5.5, 11, 10, 20], [0, 0, 34, 68], [100, 200, 0, 0]], rtol=1e-6
    )


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("concat", LAYOUTS)
def test_pool_torch_matches_numba_on_the_literal_bags(combiner, concat):
    scales = bag_scales(np.diff(OFFSETS), combiner)
    C = 2 if concat else 0
    (out, grad), (out_t, grad_t) = both(torch.from_numpy(ROWS), VIDS, OFFSETS, scales, 3, C)
    np.testing.assert_allclose(out_t, out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad_t, grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("concat", LAYOUTS)
@pytest.mark.parametrize("D", [1, 3, 8], ids=["D1", "D3", "D8"])
@pytest.mark.parametrize("seed", range(5), ids=[f"seed{s}" for s in range(5)])
@pytest.mark.parametrize("device", DEVICES)
def test_pool_torch_matches_numba_on_random_bags(combiner, concat, D, seed, device):
    rng = np.random.default_rng(seed)
    U, C, B = 40, 3, 17
    lengths = rng.integers(0, 5, C * B)  # [C*B], about a fifth of the bags empty
    lengths[rng.integers(0, C * B, 4)] = 0
    offsets = np.zeros(C * B + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    vids = rng.integers(0, U, offsets[-1]).astype(np.int64)  # [N], repeats within bags
    E0 = torch.from_numpy(rng.normal(size=(U, D)).astype(np.float32))  # [U, D]
    scales = bag_scales(lengths, combiner)
    res = both(E0, vids, offsets, scales, B, C if concat else 0, grad_seed=seed, device=device)
    (out, grad), (out_t, grad_t) = res
    assert out_t.shape == out.shape == ((B, C * D) if concat else (C * B, D))
    np.testing.assert_allclose(out_t, out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad_t, grad, rtol=1e-6, atol=1e-6)
    bags = out_t.reshape(B, C, D).transpose(1, 0, 2).reshape(C * B, D) if concat else out_t
    assert not bags[lengths == 0].any()  # empty bags give zero rows


@pytest.mark.parametrize("concat", LAYOUTS)
@pytest.mark.parametrize("device", DEVICES)
def test_pool_torch_of_an_empty_batch_and_of_only_empty_bags(concat, device):
    E0 = torch.from_numpy(ROWS)
    C = 2 if concat else 0
    none = pool_torch(E0.to(device), VIDS[:0], np.zeros(1, np.int64), np.ones(0, np.float32), 0, C)
    assert none.shape == ((0, 4) if concat else (0, 2)) and none.device == E0.to(device).device
    empty = np.zeros(7, np.int64)  # C = 2 columns of B = 3 empty bags
    ones = np.ones(6, np.float32)
    (out, grad), (out_t, grad_t) = both(E0, VIDS[:0], empty, ones, 3, C, device=device)
    np.testing.assert_array_equal(out_t, out)
    assert not out_t.any() and not grad_t.any()


def test_the_module_switch_sends_cpu_tensors_through_torch_ops(monkeypatch):
    scales = bag_scales(np.diff(OFFSETS), "sum")
    E = torch.from_numpy(ROWS).requires_grad_(True)
    assert type(pool(E, VIDS, OFFSETS, scales, 3).grad_fn).__name__ == "PoolBagsBackward"
    monkeypatch.setattr(pooling, "TORCH_ON_CPU", True)
    assert type(pool(E, VIDS, OFFSETS, scales, 3).grad_fn).__name__ != "PoolBagsBackward"
    # the argument wins over the switch
    out = pool(E, VIDS, OFFSETS, scales, 3, torch_ops=False)
    assert type(out.grad_fn).__name__ == "PoolBagsBackward"


def test_a_tensor_off_the_cpu_takes_the_torch_ops():
    # the meta device stands in for a GPU: shapes only, and no host memory to hand numba
    E = torch.empty((3, 2), device="meta", requires_grad=True)
    scales = bag_scales(np.diff(OFFSETS), "mean")
    out = pool(E, VIDS, OFFSETS, scales, 3, 2)
    assert out.device.type == "meta" and out.shape == (3, 4)
