"""Async mode in one process: the push window's staleness bound, the dense state's flattening."""

import threading
import time

import pytest
import torch

import tnrec as tn
from tnrec.errors import ArgumentError
from tnrec.ps import LocalPS
from tnrec.ps.asynchronous import PushWindow, _flat_state, _merge_states, _set_state


def _wait(fut, dest, phase):
    return fut.wait()


def test_a_pull_waits_for_every_push_older_than_the_bound():
    window = PushWindow()
    futures = [torch.futures.Future() for _ in range(5)]
    for step, fut in enumerate(futures):
        window.add(step, [(1, fut)])
    futures[4].set_result(None)  # the newest is applied; step 3's stays pending throughout

    def apply_oldest_three():
        for fut in futures[:3]:
            time.sleep(0.02)
            fut.set_result(None)

    t = threading.Thread(target=apply_oldest_three)
    t.start()
    window.wait_before(5 - 2, _wait)  # step 5 with k = 2: steps 0..2 must be applied
    done = [f.done() for f in futures[:3]]  # before the thread is joined: the window waited
    t.join()
    assert done == [True, True, True] and not futures[3].done()
    assert window.outstanding() == 1 and window.max_outstanding == 1
    futures[3].set_result(None)
    window.wait_before(6, _wait)
    assert window.outstanding() == 0 and window.max_outstanding == 1


def test_the_window_counts_steps_whose_pushes_are_outstanding():
    window = PushWindow()
    a, b = torch.futures.Future(), torch.futures.Future()
    window.add(0, [(1, a), (2, b)])
    window.add(1, [])  # a step that sent nothing (all its keys were this worker's own)
    a.set_result(None)
    window.wait_before(0, _wait)
    assert window.outstanding() == 1 and window.max_outstanding == 1
    b.set_result(None)
    window.wait_before(2, _wait)
    assert window.outstanding() == 0


def test_a_failed_push_raises_at_the_next_pull():
    window = PushWindow()
    fut = torch.futures.Future()
    fut.set_exception(RuntimeError("ECONNRESET"))
    window.add(0, [(1, fut)])
    with pytest.raises(RuntimeError, match="ECONNRESET"):
        window.wait_before(1, _wait)


def test_dense_state_splits_into_ranges_and_joins_back():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    params = list(net.parameters())
    opt = torch.optim.Adam(params, lr=0.1)
    net(torch.randn(5, 3)).sum().backward()
    opt.step()
    flat = _flat_state(opt, params)
    assert flat["exp_avg"][1] and not flat["step"][1]
    total = sum(p.numel() for p in params)
    assert flat["exp_avg"][0].shape == (total,)
    # three ranges, as three workers' dense servers hold them, joined back
    cuts = [0, 7, 15, total]
    parts = [
        (
            torch.zeros(cuts[i + 1] - cuts[i]),
            {"exp_avg": flat["exp_avg"][0][cuts[i] : cuts[i + 1]], "step": flat["step"][0]},
        )
        for i in range(3)
    ]
    other = torch.optim.Adam(params, lr=0.1)
    _set_state(other, params, _merge_states(parts))
    for p in params:
        torch.testing.assert_close(other.state[p]["exp_avg"], opt.state[p]["exp_avg"])
        assert float(other.state[p]["step"]) == 1.0


def test_an_optimizer_with_state_not_per_element_is_refused():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    opt.state[p] = {"factored": torch.zeros(2)}
    with pytest.raises(ArgumentError, match="one value per element or a scalar"):
        _flat_state(opt, [p])


def test_async_in_one_process_is_the_local_ps():
    strategy = tn.distribute.PsStrategy(mode="async", staleness=4)
    try:
        assert not strategy.asynchronous
        ps = strategy.make_ps({})
        assert isinstance(ps, LocalPS) and not ps.asynchronous
    finally:
        strategy.shutdown()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "hogwild"}, r'`mode` must be "sync" or "async". Received: mode=\'hogwild\''),
        ({"staleness": -1}, r"`staleness` must be an int >= 0. Received: staleness=-1"),
        ({"staleness": 1.5}, r"`staleness` must be an int >= 0. Received: staleness=1.5"),
        ({"staleness": True}, r"`staleness` must be an int >= 0. Received: staleness=True"),
    ],
)
def test_bad_mode_or_staleness_is_refused(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        tn.distribute.PsStrategy(**kwargs)
