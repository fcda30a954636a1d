"""A model dir's history survives a lost or damaged pointer, concurrent runs and a full disk."""

import json
import os
import shutil

import pytest

from tnrec import checkpoint
from tnrec.errors import CheckpointError, ChecksumError, WriteError


@pytest.fixture
def three_generations(common, tmp_path):
    """A model dir with generations d1/1, d1/2, d2/3 (pointer on d2/3)."""
    model = common.build()
    data = common.reader(common.write_day(str(tmp_path), 0))
    model_dir = tmp_path / "m"
    for day in ("d1", "d1", "d2"):
        model.fit(data, verbose=0)
        model.save_weights(str(model_dir), day)
    return model, model_dir, data


def _gens(model_dir):
    return sorted(
        (dt, int(g))
        for dt in os.listdir(model_dir)
        if not dt.startswith((".", "_"))
        for g in os.listdir(model_dir / dt)
        if g.isdigit()
    )


def test_missing_pointer_is_an_error_naming_the_newest_complete_generation(three_generations):
    model, model_dir, _ = three_generations
    (model_dir / "_checkpoint").unlink()
    with pytest.raises(CheckpointError, match=r"3 complete checkpoint\(s\) but no _checkpoint"):
        model.load_weights(str(model_dir))
    with pytest.raises(CheckpointError, match=r"tnrec checkpoint publish .*d2/3"):
        model.save_weights(str(model_dir), "d3")
    assert _gens(model_dir) == [("d1", 1), ("d1", 2), ("d2", 3)]  # nothing deleted


def test_publish_restores_a_lost_pointer_and_the_next_save_takes_max_plus_one(
    common, three_generations
):
    model, model_dir, data = three_generations
    (model_dir / "_checkpoint").unlink()
    checkpoint.publish(str(model_dir / "d1" / "2"))  # roll back to d1/2
    fresh = common.build()
    assert fresh.load_weights(str(model_dir)).generation == 2
    fresh.fit(data, verbose=0)
    assert fresh.save_weights(str(model_dir), "d3").endswith("d3/4")
    assert _gens(model_dir) == [("d1", 1), ("d1", 2), ("d2", 3), ("d3", 4)]


@pytest.mark.parametrize(
    "pointer, match",
    [
        pytest.param(
            {"dt": "d2", "dir": "d1/1", "generation": 3}, "disagrees with itself", id="dir-vs-gen"
        ),
        pytest.param(
            {"dt": "d1", "dir": "d1/3", "generation": 3}, "which has no manifest", id="wrong-day"
        ),
        pytest.param(
            {"dt": "..", "dir": "../other/3", "generation": 3}, "not a day label", id="outside"
        ),
        pytest.param({"dt": "d2", "dir": "d2/3"}, "field 'generation' is missing", id="no-gen"),
        pytest.param(
            {"dt": "d2", "dir": "d2/3", "generation": "3"}, "must be int", id="gen-as-str"
        ),
    ],
)
def test_an_inconsistent_pointer_is_refused_and_nothing_is_deleted(
    three_generations, pointer, match
):
    model, model_dir, _ = three_generations
    (model_dir / "_checkpoint").write_text(json.dumps(pointer))
    with pytest.raises(CheckpointError, match=match):
        model.load_weights(str(model_dir))
    with pytest.raises(CheckpointError, match=match):
        model.save_weights(str(model_dir), "d3")
    assert _gens(model_dir) == [("d1", 1), ("d1", 2), ("d2", 3)]


def test_a_pointer_whose_manifest_is_another_generation_is_refused(three_generations):
    model, model_dir, _ = three_generations
    shutil.move(model_dir / "d2" / "3", model_dir / "d2" / "8")
    (model_dir / "_checkpoint").write_text(json.dumps({"dt": "d2", "dir": "d2/8", "generation": 8}))
    with pytest.raises(CheckpointError, match="is day 'd2' generation 3; refusing to guess"):
        model.load_weights(str(model_dir))


def test_a_flipped_bit_in_the_pointer_or_manifest_is_refused(three_generations):
    model, model_dir, _ = three_generations
    pointer = model_dir / "_checkpoint"
    good = pointer.read_bytes()
    pointer.write_bytes(good.replace(b'"generation": 3', b'"generation": 2'))
    with pytest.raises(ChecksumError, match="checkpoint pointer .* is corrupt"):
        model.load_weights(str(model_dir))
    pointer.write_bytes(good)
    manifest = model_dir / "d2" / "3" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"global_step": 45', b'"global_step": 44'))
    with pytest.raises(ChecksumError, match="checkpoint manifest .* is corrupt"):
        model.load_weights(str(model_dir))


def test_manifest_schema_is_checked_field_by_field(three_generations):
    model, model_dir, _ = three_generations
    path = model_dir / "d2" / "3" / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["checksum"]
    doc["format_version"] = 1  # a legacy manifest: no checksum, schema still checked
    doc["resume"]["global_step"] = -5
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"resume.global_step must be an int >= 0"):
        model.load_weights(str(model_dir))
    doc["resume"]["global_step"] = 5
    doc["tables"]["emb"]["parts"][0]["dir"] = "../../../elsewhere"
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="is not a path inside the checkpoint directory"):
        model.load_weights(str(model_dir))


def test_keep_prunes_only_older_complete_generations(common, three_generations):
    model, model_dir, data = three_generations
    (model_dir / "_checkpoint").unlink()
    checkpoint.publish(str(model_dir / "d1" / "1"))  # roll back: 2 and 3 are newer
    model.load_weights(str(model_dir))
    model.fit(data, verbose=0)
    model.save_weights(str(model_dir), "d3", keep=1)
    # gen 1 is older than the new published gen 4 and beyond keep=1: pruned.
    # 2 and 3 are older too: pruned. Only what keep allows stays.
    assert _gens(model_dir) == [("d3", 4)]


def test_a_second_run_on_a_locked_model_dir_is_refused_naming_the_pid(three_generations):
    from tnrec import _fileio

    model, model_dir, _ = three_generations
    with _fileio.DirLock(str(model_dir)):
        # another process would hold it; in this process a second DirLock on a new fd conflicts
        other = _fileio.DirLock(str(model_dir), "model dir")
        with pytest.raises(WriteError, match=rf"already in use by pid {os.getpid()}"):
            other.acquire()


def test_disk_full_during_a_save_names_the_path_and_keeps_the_last_checkpoint(
    common, three_generations, monkeypatch
):
    model, model_dir, data = three_generations
    want = common.snapshot(model)
    model.fit(data, verbose=0)
    for point in ("weights.npy", "table.json", "dense.pt", "rank-0.json", "manifest.json"):
        monkeypatch.setenv("TNREC_FAIL_WRITE", point)
        with pytest.raises(WriteError, match=rf"Cannot write .*{point}: No space left on device"):
            model.save_weights(str(model_dir), "d3")
        monkeypatch.delenv("TNREC_FAIL_WRITE")
        fresh = common.build()
        assert fresh.load_weights(str(model_dir)).generation == 3
        common.assert_same(common.snapshot(fresh), want, skip=())
        assert (
            not [e for e in os.listdir(model_dir / "d3")] if (model_dir / "d3").exists() else True
        )
    assert model.save_weights(str(model_dir), "d3").endswith("d3/4")
    from tnrec import _fileio

    with _fileio.DirLock(str(model_dir)):  # the failed saves released the model-dir lock
        pass


def test_cli_checkpoint_publish_restores_the_pointer(three_generations, capsys):
    from tnrec.cli import main

    model, model_dir, _ = three_generations
    (model_dir / "_checkpoint").unlink()
    assert main(["checkpoint", "publish", str(model_dir / "d2" / "3")]) == 0
    assert "now names" in capsys.readouterr().out
    assert model.load_weights(str(model_dir)).generation == 3
    (model_dir / "d1" / "2" / "dense.pt").write_bytes(b"damaged")
    assert main(["checkpoint", "publish", str(model_dir / "d1" / "2")]) == 2
    assert "dense.pt is corrupt" in capsys.readouterr().err
    assert main(["checkpoint", "publish", str(model_dir / "d1")]) == 2
    assert "is not a checkpoint generation directory" in capsys.readouterr().err
    assert checkpoint.read_pointer(str(model_dir)).generation == 3  # unchanged by the refusals


def test_a_published_generation_that_lost_its_manifest_is_an_error(three_generations):
    model, model_dir, _ = three_generations
    (model_dir / "d1" / "1" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"d1/1/manifest\.json is missing: generation 1"):
        model.load_weights(str(model_dir), "d1")
    assert model.load_weights(str(model_dir)).generation == 3  # the published one still loads


def test_daily_training_into_a_dir_without_pointer_refuses_and_deletes_nothing(
    common, three_generations
):
    from tnrec.daily import train_days

    model, model_dir, data = three_generations
    (model_dir / "_checkpoint").unlink()
    with pytest.raises(CheckpointError, match="no _checkpoint"):
        train_days(common.build(), [("d3", lambda: data)], str(model_dir))
    assert _gens(model_dir) == [("d1", 1), ("d1", 2), ("d2", 3)]
