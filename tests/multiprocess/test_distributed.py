"""W workers train the same model as 1 worker; uneven data; failures do not hang."""

import numpy as np
import pytest

from tests.multiprocess import mp_scenarios


def load(out_dir, scenario, world):
    return [dict(np.load(out_dir / f"{scenario}-rank{r}.npz")) for r in range(world)]


def merged_tables(parts, prefix):
    """Union of every worker's shard of each table, sorted by key."""
    tables = {}
    for part in parts:
        for k, v in part.items():
            if k.startswith(prefix + "/table/"):
                tname, array = k[len(prefix) + 7 :].split("/")
                tables.setdefault(tname, {}).setdefault(array, []).append(v)
    out = {}
    for tname, arrays in tables.items():
        keys = np.concatenate(arrays["keys"])
        order = np.argsort(keys)
        assert np.unique(keys).shape == keys.shape, "a key lives on two workers"
        out[tname] = {a: np.concatenate(v)[order] for a, v in arrays.items()}
    return out


@pytest.fixture(scope="module")
def reference():
    # 1 worker, in this process: no strategy, a local parameter server
    return mp_scenarios.run_contract(0, 1)


@pytest.mark.parametrize(
    ("world", "scenario"),
    [(2, "contract"), (3, "contract"), (2, "contract_dense_gloo"), (2, "contract_push_beside")],
    ids=["2", "3", "2-dense-group", "2-push-beside"],
)
def test_w_workers_train_the_same_model_as_one(launch, tmp_path, reference, world, scenario):
    """``contract_dense_gloo``: ``PsStrategy(dense_backend="gloo")``, so the dense all-reduce
    and broadcasts run on a second process group (what a CUDA model's NCCL group is), the
    sparse exchange on the first. ``contract_push_beside``: every step pushes (its sparse
    exchange included) in a second thread while the dense optimizer steps."""
    res = launch(world, [scenario, str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, scenario, world)
    for opt in mp_scenarios.OPTIMIZERS:
        want_groups = ["gloo"] if scenario == "contract_dense_gloo" else []
        for r in range(world):
            assert parts[r][f"{opt}/dense_groups"].tolist() == want_groups
        for r in range(world):
            np.testing.assert_allclose(
                parts[r][f"{opt}/loss"], reference[f"{opt}/loss"], rtol=1e-5, atol=1e-6
            )
        for k, v in reference.items():
            if k.startswith(f"{opt}/dense/"):
                for r in range(world):
                    np.testing.assert_allclose(parts[r][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        ours = merged_tables(parts, opt)
        ref = merged_tables([reference], opt)
        assert sorted(ours) == sorted(ref) == ["c", "shared"]
        for tname in ref:
            for array, v in ref[tname].items():
                np.testing.assert_allclose(
                    ours[tname][array], v, rtol=1e-5, atol=1e-6, err_msg=f"{opt} {tname} {array}"
                )
    # shutdown() ends Gloo's threads; left running, their teardown at exit can abort the process
    for r in range(world):
        threads = (tmp_path / f"{scenario}-threads-rank{r}.txt").read_text().split()
        assert threads and not [t for t in threads if "gloo" in t], threads


@pytest.mark.parametrize("world", [2])
def test_w_workers_train_a_cvm_model_with_a_frozen_layer_as_one(launch, tmp_path, world):
    reference = mp_scenarios.run_cvm_frozen(0, 1)
    res = launch(world, ["cvm_frozen", str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "cvm_frozen", world)
    for opt in mp_scenarios.OPTIMIZERS:
        for k, v in reference.items():
            if k.startswith(f"{opt}/loss") or k.startswith(f"{opt}/dense/"):
                for r in range(world):
                    np.testing.assert_allclose(parts[r][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        ours, ref = merged_tables(parts, opt), merged_tables([reference], opt)
        for tname in ref:
            for array, v in ref[tname].items():
                np.testing.assert_allclose(
                    ours[tname][array], v, rtol=1e-5, atol=1e-6, err_msg=f"{opt} {tname} {array}"
                )
        shared = ref["shared"]
        items = shared["keys"] >= (1 << 40)  # read only by the frozen layer: never pushed
        assert items.any() and (shared["show"][items] == 0).all()
        assert (shared["marker"][items] == 1).all() and (shared["show"][~items] > 0).any()


def test_pipelined_fit_on_two_workers_with_uneven_parts_is_bit_identical(launch, tmp_path):
    res = launch(2, ["pipeline", str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    for r, part in enumerate(load(tmp_path, "pipeline", 2)):
        inline = {k[len("inline/") :]: v for k, v in part.items() if k.startswith("inline/")}
        assert len(inline) > 10 and inline["loss"].shape == (2 * 14,)
        assert part.pop("pipelined/route_s") > 0 and inline.pop("route_s") == 0  # routed ahead
        for k, v in inline.items():
            np.testing.assert_array_equal(part[f"pipelined/{k}"], v, err_msg=f"rank {r}: {k}")
        assert not part["input_threads"].any()  # every epoch's input thread was joined


def test_a_stalled_worker_raises_instead_of_hanging(launch, tmp_path):
    res = launch(2, ["timeout", str(tmp_path), "3"], timeout_s=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert (
        "DistributedError: rank 0/2: collective 'all-reduce statistics' failed or did not "
        "complete within 3 s" in out
    )


def test_a_crashed_worker_makes_every_worker_exit_non_zero(launch, tmp_path):
    res = launch(2, ["crash", str(tmp_path), "30"], timeout_s=120)
    assert res.returncode != 0
    assert not (tmp_path / "crash-rank0.npz").exists()


def test_uneven_files_train_every_row_once_and_metrics_are_global(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_scenarios.write_uneven_files(str(data))  # 60, 0 and 1 rows
    res = launch(3, ["uneven", str(tmp_path), "120", str(data)])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "uneven", 3)
    ref = mp_scenarios.run_uneven(0, 1, str(data))
    trained = np.concatenate([p["trained_rows"] for p in parts])
    assert trained.shape == (61,) and np.unique(trained).shape == (61,)  # every row once
    np.testing.assert_array_equal(np.sort(trained), np.sort(ref["trained_rows"]))
    assert [p["trained_rows"].shape[0] for p in parts] == [60, 0, 1]
    for k, v in ref.items():
        if k.startswith("eval/"):
            for p in parts:  # every worker reports the global figures
                np.testing.assert_allclose(p[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    rows = np.concatenate([p["predict/row_id"] for p in parts])
    preds = np.concatenate([p["predict/prediction"] for p in parts])
    order, ref_order = np.argsort(rows), np.argsort(ref["predict/row_id"])
    np.testing.assert_array_equal(rows[order], ref["predict/row_id"][ref_order])
    np.testing.assert_allclose(
        preds[order], ref["predict/prediction"][ref_order], rtol=1e-5, atol=1e-6
    )


def test_checkpoints_reshard_between_any_numbers_of_workers(launch, tmp_path):
    one, two = str(tmp_path / "w1"), str(tmp_path / "w2")
    ref = mp_scenarios.run_reshard(0, 1, "-", one)  # saved by 1 worker
    # 2 workers: load the 1-worker checkpoint, then train the same steps and save their own
    res = launch(2, ["reshard", str(tmp_path), "120", one, two])
    assert res.returncode == 0, res.stdout + res.stderr
    parts2 = load(tmp_path, "reshard", 2)
    # 1 worker loads the 2-worker checkpoint (in this process)
    loaded1 = mp_scenarios.run_reshard(0, 1, two, "-")
    # 3 workers load the 2-worker checkpoint
    res = launch(3, ["reshard", str(tmp_path), "120", two, "-"])
    assert res.returncode == 0, res.stdout + res.stderr
    parts3 = load(tmp_path, "reshard", 3)

    def check(parts, prefix, want_parts, want_prefix):
        got = merged_tables(parts, prefix)
        want = merged_tables(want_parts, want_prefix)
        assert sorted(got) == sorted(want) == ["c", "shared"]
        for t in want:
            for a, v in want[t].items():
                if a != "marker":
                    np.testing.assert_allclose(
                        got[t][a], v, rtol=1e-5, atol=1e-6, err_msg=f"{t} {a}"
                    )
        for p in parts:
            np.testing.assert_allclose(
                p[f"{prefix}/prediction"],
                want_parts[0][f"{want_prefix}/prediction"],
                rtol=1e-5,
                atol=1e-6,
            )

    check(parts2, "loaded", [ref], "saved")  # save on 1 -> load on 2
    check(parts2, "saved", [ref], "saved")  # 2 workers trained the same model as 1
    check([loaded1], "loaded", parts2, "saved")  # save on 2 -> load on 1
    check(parts3, "loaded", parts2, "saved")  # save on 2 -> load on 3


def test_daily_counts_are_global_once_not_times_w(launch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    mp_scenarios.write_uneven_files(str(data))
    res = launch(3, ["daily", str(tmp_path), "120", str(data), str(tmp_path / "m")])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "daily", 3)
    one = mp_scenarios.run_daily(0, 1, str(data), str(tmp_path / "m1"))
    for part in parts:
        # the first day starts from empty tables and evicts nothing: created == size
        assert part["keys_created"][0] == part["sizes"][0] == one["keys_created"][0]
        np.testing.assert_array_equal(part["keys_created"], one["keys_created"])
        np.testing.assert_array_equal(part["rows"], one["rows"])
        assert part["rows"][0] == 61


def test_w_workers_admit_and_cap_the_same_rows_as_one(launch, tmp_path):
    ref = mp_scenarios.run_admission(0, 1, str(tmp_path / "one"))
    # the scenario really exercises both: keys refused, admitted, and evicted by the cap
    refused, admitted, evicted = (ref["counters"][i] for i in (2, 0, 1))
    assert refused > 0 and admitted > 0 and evicted > 0, ref["counters"]
    res = launch(2, ["admission", str(tmp_path), "120", str(tmp_path / "two")])
    assert res.returncode == 0, res.stdout + res.stderr
    parts = load(tmp_path, "admission", 2)
    for p in parts:
        np.testing.assert_allclose(p["loss"], ref["loss"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(p["counters"], ref["counters"])
    ours, want = merged_tables(parts, "admission")["e"], merged_tables([ref], "admission")["e"]
    np.testing.assert_array_equal(ours["keys"], want["keys"])
    for a, v in want.items():
        np.testing.assert_allclose(ours[a], v, rtol=1e-5, atol=1e-6, err_msg=a)
    assert want["keys"].shape[0] <= 1024 + 80  # the cap plus one batch's keys
    # the sketch: every worker's own buckets give the single worker's estimates
    keys = np.concatenate([p["sketch_keys"] for p in parts])
    est = np.concatenate([p["sketch"] for p in parts])
    order = np.argsort(keys)
    ref_order = np.argsort(ref["sketch_keys"])
    np.testing.assert_array_equal(keys[order], ref["sketch_keys"][ref_order])
    np.testing.assert_array_equal(est[order], ref["sketch"][ref_order])
    # resharded: one worker loading the two workers' checkpoint has the same sketch and rows
    back = mp_scenarios.load_admission(str(tmp_path / "two"))
    np.testing.assert_array_equal(back["keys"], want["keys"])
    np.testing.assert_array_equal(
        back["sketch"], mp_scenarios.load_admission(str(tmp_path / "one"))["sketch"]
    )
