"""Checkpoints written to S3 (moto's server on 127.0.0.1): what a local disk guarantees, with
the pointer as the commit point.

The daily cycle of ``tests/unit/checkpoint/ckpt_common.py`` (two days, a save every 5
steps) runs in a child process with its model dir on S3; killed by SIGKILL at a point of
its 3rd save, the published checkpoint loads exactly as a local reference run wrote it,
and running it again finishes with the reference's model. Faults injected at the server
during a save are retried, or, when they persist, fail the save with an error naming the
object while the published checkpoint stays as it was.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.faults.conftest import build_model, differences, model_state, train, write_data
from tests.unit.checkpoint import ckpt_common as common
from tests.unit.checkpoint.test_kill import child, reference_run
from tnrec import checkpoint
from tnrec.cli import main
from tnrec.errors import WriteError


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted daily cycle with its model dir on the local disk."""
    return reference_run(tmp_path_factory.mktemp("reference")) / "m"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The fault suites' small WideDeep, trained on one day."""
    data = write_data(str(tmp_path_factory.mktemp("data") / "day.parquet"), seed=0)
    return train(build_model(), data)


def _loaded(path: str) -> dict:
    model = common.build()
    root = os.path.dirname(os.path.dirname(path))
    assert checkpoint.load(model, root, path=path) is not None
    return common.snapshot(model)


def _final(model_dir: str) -> dict:
    model = common.build()
    assert model.load_weights(model_dir) is not None
    return common.snapshot(model)


def _unpublished(s3, prefix: str) -> list[str]:
    """Generation directories under ``prefix`` that hold objects but no manifest."""
    gens: dict[str, set[str]] = {}
    for key in s3.keys(prefix):
        parts = key[len(prefix) :].split("/")
        if len(parts) >= 3 and parts[1].isdigit():
            gens.setdefault("/".join(parts[:2]), set()).add("/".join(parts[2:]))
    return sorted(g for g, files in gens.items() if "manifest.json" not in files)


def test_the_daily_cycle_on_s3_saves_what_it_saves_on_a_local_disk(s3, reference, tmp_path):
    (tmp_path / "data").mkdir()
    root = s3.uri("models/ctr")
    res = child(root, tmp_path / "data")
    assert res.returncode == 0, res.stderr
    local = [(dt, g) for dt, g in checkpoint.generations(str(reference))]
    assert checkpoint.generations(root) == local
    common.assert_same(_final(root), _final(str(reference)), skip=())
    keys = s3.keys("models/ctr/")
    assert "models/ctr/_checkpoint" in keys
    assert not [k for k in keys if ".tmp" in k or ".lock" in k]
    dt, g = local[-1]
    assert checkpoint.latest(root) == f"{root}/{dt}/{g}"
    checkpoint.verify(checkpoint.latest(root))


# the two kills whose leftovers are the store's own to handle: while tables are written
# (objects under the generation, no manifest), and after the manifest but before the pointer
# (a complete generation nobody published); a kill after the pointer leaves nothing to clean
# up, and tests/unit/checkpoint/test_kill.py covers it with every other point
KILLS = {"after-table:emb": 2, "before-publish": 2}


@pytest.mark.parametrize("point", sorted(KILLS))
def test_a_save_to_s3_killed_at_any_point_resumes_exactly(s3, reference, tmp_path, point):
    (tmp_path / "data").mkdir()
    root = s3.uri("m")
    res = child(root, tmp_path / "data", kill_at=point, hit=3)
    assert res.returncode == -signal.SIGKILL, res.stderr
    last = checkpoint.latest(root)
    assert last is not None and last.endswith(f"/{KILLS[point]}"), last
    rel = last[len(root) + 1 :]
    common.assert_same(_loaded(last), _loaded(str(reference / rel)), skip=())
    if point == "after-table:emb":
        assert _unpublished(s3, "m/"), "the killed save left no objects to clean up"
    res = child(root, tmp_path / "data")  # run again: resumes and finishes
    assert res.returncode == 0, res.stderr
    assert _unpublished(s3, "m/") == []  # what the killed save left is gone
    # a complete generation that was never published is kept, so the resumed run numbers
    # its saves one higher, and the update markers (generation numbers) with them
    kept = point == "before-publish"
    common.assert_same(_final(root), _final(str(reference)), skip=("marker",) if kept else ())


def test_throttling_drops_and_slow_responses_during_a_save_are_retried(s3, trained):
    root = s3.uri("m")
    s3.proxy.fail_next("503", 2, method="PUT")
    s3.proxy.fail_next("drop", 1, method="PUT")
    s3.proxy.fail_next("slow", 1, method="PUT")
    trained.save_weights(root, "2024-05-10")
    assert s3.proxy.injected == 4
    model = build_model()
    assert model.load_weights(root) is not None
    assert differences(model_state(model), model_state(trained)) == []


def test_a_store_that_keeps_failing_fails_the_save_and_publishes_nothing(s3, trained, monkeypatch):
    monkeypatch.setenv("TNREC_IO_ATTEMPTS", "2")
    root = s3.uri("m")
    trained.save_weights(root, "2024-05-10")
    want = model_state(trained)
    before = s3.get_bytes("m/_checkpoint")
    s3.proxy.fail_always("503", method="PUT", path_contains="/2024-05-11/")
    with pytest.raises(WriteError, match=rf"Cannot write s3://{s3.bucket}/m/2024-05-11/2/.*2 att"):
        trained.save_weights(root, "2024-05-11")
    s3.proxy.clear()
    assert s3.get_bytes("m/_checkpoint") == before  # the pointer still names generation 1
    assert checkpoint.generations(root) == [("2024-05-10", 1)]
    model = build_model()
    assert model.load_weights(root).generation == 1
    assert differences(model_state(model), want) == []
    assert trained.save_weights(root, "2024-05-11").endswith("/2024-05-11/2")
    assert _unpublished(s3, "m/") == []
    assert checkpoint.generations(root) == [("2024-05-10", 1), ("2024-05-11", 2)]


def test_keep_prunes_old_generations_on_s3_and_publish_rolls_back(s3, trained, capsys):
    root = s3.uri("m")
    for day in ("2024-05-10", "2024-05-11", "2024-05-12"):
        trained.save_weights(root, day, keep=2)
    assert checkpoint.generations(root) == [("2024-05-11", 2), ("2024-05-12", 3)]
    assert not s3.keys("m/2024-05-10/1/")
    assert main(["checkpoint", "publish", f"{root}/2024-05-11/2"]) == 0
    assert f"now names {root}/2024-05-11/2" in capsys.readouterr().out
    assert checkpoint.latest(root) == f"{root}/2024-05-11/2"
    # the next save takes a number no generation has had, so nothing is overwritten
    assert trained.save_weights(root, "2024-05-13").endswith("/2024-05-13/4")


def test_tnrec_inspect_reads_a_model_dir_on_s3(s3, trained, capsys):
    root = s3.uri("m")
    trained.save_weights(root, "2024-05-10")
    assert main(["inspect", root]) == 0
    out = capsys.readouterr().out
    assert "2024-05-10" in out and "emb" in out and "wide" in out
    assert main(["inspect", root, "--json"]) == 0
    assert '"generation": 1' in capsys.readouterr().out
    victim = next(k for k in s3.keys("m/2024-05-10/1/sparse/emb/") if k.endswith("weights.npy"))
    data = bytearray(s3.get_bytes(victim))
    data[-1] ^= 0x01
    s3.put_bytes(victim, bytes(data))
    assert main(["inspect", root]) != 0
    assert f"s3://{s3.bucket}/{victim}" in capsys.readouterr().err
