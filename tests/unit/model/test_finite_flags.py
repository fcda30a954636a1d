"""steps._finite_flags: one flag a tensor, exact, whichever way a tensor is checked.

Small CPU float32 tensors go through NumPy, big ones (``FINITE_SUM_MIN`` values
or more) are summed first; the others (a GPU model's, here float64 and bfloat16
on the CPU take the same path) are summed and the sums checked together, a sum
that is not finite sending its tensor to the exact check.
"""

import numpy as np
import pytest
import torch

from tnrec import steps
from tnrec.steps import _finite_flags

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
BIG = {torch.float32: 3e38, torch.float64: 1e308, torch.bfloat16: 3e38}
SUM_MIN = steps.FINITE_SUM_MIN  # the library's threshold (a test below moves it)


def exact(t):
    return bool(torch.isfinite(t.float() if t.dtype == torch.bfloat16 else t).all())


def cases(dtype, device):
    """Finite, NaN, +inf, -inf, +inf and -inf together, finite values that overflow a
    sum, empty, a 0-d value and a tensor that needs grad."""
    big = BIG[dtype]
    return [
        torch.randn(50, 3, dtype=dtype, device=device),
        torch.tensor([1.0, float("nan"), 2.0], dtype=dtype, device=device),
        torch.tensor([float("inf"), 1.0], dtype=dtype, device=device),
        torch.tensor([-float("inf")], dtype=dtype, device=device),
        torch.tensor([float("inf"), -float("inf")], dtype=dtype, device=device),
        torch.full((8,), big, dtype=dtype, device=device),  # finite, the sum is not
        torch.zeros(0, dtype=dtype, device=device),
        torch.tensor(2.5, dtype=dtype, device=device),
        torch.ones(4, dtype=dtype, device=device, requires_grad=True),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_each_flag_is_the_exact_answer(dtype, device):
    ts = cases(dtype, device)
    want = [exact(t) for t in ts]
    assert want == [True, False, False, False, False, True, True, True, True]
    assert _finite_flags(ts) == want


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_keep_their_order(device):
    ts = [
        c for dtype in (torch.float64, torch.float32, torch.bfloat16) for c in cases(dtype, device)
    ]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(ts))
    shuffled = [ts[i] for i in order]
    assert _finite_flags(shuffled) == [exact(t) for t in shuffled]


def test_nothing_gives_nothing():
    assert _finite_flags([]) == []


@pytest.mark.parametrize("threshold", [1, SUM_MIN])
def test_big_cpu_float32_tensors_summed_first_are_exact(monkeypatch, threshold):
    """At and above the threshold: a NaN or an infinity anywhere, and finite values whose
    sum overflows (finite, checked value by value), each get the exact flag."""
    monkeypatch.setattr(steps, "FINITE_SUM_MIN", threshold)
    n = SUM_MIN
    nan, inf = torch.randn(n), torch.randn(n + 7, 2)
    nan[n - 1] = float("nan")
    inf[3, 1] = -float("inf")
    ts = [
        *cases(torch.float32, "cpu"),
        torch.randn(n),
        nan,
        inf,
        torch.full((n,), 3e38),  # finite, the sum overflows
        torch.randn(n, requires_grad=True),
    ]
    want = [exact(t) for t in ts]
    assert want[-5:] == [True, False, False, True, True]
    assert _finite_flags(ts) == want
