"""W workers under a learning-rate schedule train the same model as 1 worker: the
schedule runs on the global step, which every worker shares."""

import numpy as np

from tests.multiprocess import mp_scenarios
from tests.multiprocess.test_distributed import load, merged_tables
from tnrec.schedules import ExponentialDecay, WarmUp


def test_w_workers_follow_the_same_schedule_and_train_what_one_trains(launch, tmp_path):
    ref = mp_scenarios.run_schedule(0, 1)
    factors = WarmUp(5, 0.2, then=ExponentialDecay(3, 0.7))
    want = np.array([[0.01 * factors(t)] + [0.1 * factors(t)] * 2 for t in range(20)])
    np.testing.assert_array_equal(ref["schedule/rates"], want)
    res = launch(2, ["schedule", str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "schedule", 2)
    for p in parts:  # rank 0's slice is empty every 5th step; its rates still follow
        np.testing.assert_array_equal(p["schedule/rates"], want)
        for k, v in ref.items():
            if k.startswith("schedule/dense/"):
                np.testing.assert_allclose(p[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    ours, ones = merged_tables(parts, "schedule"), merged_tables([ref], "schedule")
    assert sorted(ours) == sorted(ones) == ["c", "shared"]
    for tname, arrays in ones.items():
        np.testing.assert_array_equal(ours[tname]["keys"], arrays["keys"])
        for a, v in arrays.items():
            np.testing.assert_allclose(
                ours[tname][a], v, rtol=1e-5, atol=1e-6, err_msg=f"{tname}/{a}"
            )
