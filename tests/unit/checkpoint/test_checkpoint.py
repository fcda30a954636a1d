"""save_weights / load_weights, the daily cycle, refusals and warm start (one process)."""

import json
import os

import numpy as np
import pytest

from tnrec import _fileio, checkpoint
from tnrec.errors import (
    ArgumentError,
    CheckpointError,
    ChecksumError,
    FormatVersionError,
    MismatchError,
)


def test_round_trip_is_exact_and_layout_is_as_documented(common, tmp_path):
    model = common.build()
    model.fit(common.reader(common.write_day(str(tmp_path), 0)), verbose=0)
    path = model.save_weights(str(tmp_path / "m"), "2024-05-10", keep=3)
    assert path == str(tmp_path / "m" / "2024-05-10" / "1")
    assert json.loads((tmp_path / "m" / "_checkpoint").read_text())["dir"] == "2024-05-10/1"
    manifest = json.loads((tmp_path / "m" / "2024-05-10" / "1" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and sorted(manifest["tables"]) == ["emb", "wide"]
    assert manifest["resume"]["global_step"] == model.global_step == 15
    assert os.path.isfile(
        os.path.join(path, "sparse", "emb", "part-00000-of-00001", "bucket_offsets.npy")
    )
    want = common.snapshot(model)
    fresh = common.build()
    report = fresh.load_weights(str(tmp_path / "m"))
    common.assert_same(common.snapshot(fresh), want, skip=())
    assert report.generation == 1 and fresh.global_step == 15
    assert all(t.generation == 2 for t in fresh.tables.values())
    # the loaded model trains on exactly like the original
    batch = next(iter(common.reader(common.write_day(str(tmp_path), 1))))
    assert fresh.train_step(batch) == model.train_step(batch)


def test_load_from_an_empty_dir_does_nothing_and_says_so(common, tmp_path, capsys):
    model = common.build()
    assert model.load_weights(str(tmp_path / "nothing")) is None
    assert "no checkpoint in" in capsys.readouterr().out
    assert all(len(t) == 0 for t in model.tables.values())


def test_generations_are_fresh_directories_and_keep_prunes_old_ones(common, tmp_path):
    model = common.build()
    data = common.reader(common.write_day(str(tmp_path), 0))
    paths = []
    for day in ("d1", "d1", "d2", "d3"):
        model.fit(data, verbose=0)
        paths.append(model.save_weights(str(tmp_path / "m"), day, keep=2))
    assert [os.path.basename(p) for p in paths] == ["1", "2", "3", "4"]
    assert checkpoint.generations(str(tmp_path / "m")) == [("d2", 3), ("d3", 4)]
    assert checkpoint.latest(str(tmp_path / "m"), "d2").endswith("d2/3")
    assert checkpoint.latest(str(tmp_path / "m"), "d1") is None
    with pytest.raises(ArgumentError, match="`dt` must be a plain directory name"):
        model.save_weights(str(tmp_path / "m"), "../x")
    with pytest.raises(ArgumentError, match="`keep` must be >= 1"):
        model.save_weights(str(tmp_path / "m"), "d4", keep=0)


@pytest.fixture
def saved(common, tmp_path):
    model = common.build()
    model.fit(common.reader(common.write_day(str(tmp_path), 0)), verbose=0)
    model.save_weights(str(tmp_path / "m"), "d0")
    return model, tmp_path / "m", tmp_path / "m" / "d0" / "1"


def _refused(common, model_dir, error, match, **build):
    fresh = common.build(**build)
    before = common.snapshot(fresh)
    with pytest.raises(error, match=match):
        fresh.load_weights(str(model_dir))
    common.assert_same(common.snapshot(fresh), before, skip=())  # never half-loaded


def test_corrupt_and_truncated_files_are_refused(common, saved):
    _, model_dir, path = saved
    w = path / "sparse" / "emb" / "part-00000-of-00001" / "weights.npy"
    good = w.read_bytes()
    data = bytearray(good)
    data[-1] ^= 0x55
    w.write_bytes(bytes(data))
    _refused(common, model_dir, ChecksumError, r"weights\.npy is corrupt")
    w.write_bytes(good)
    dense = path / "dense.pt"
    dense.write_bytes(dense.read_bytes()[:100])
    _refused(common, model_dir, ChecksumError, r"dense\.pt is corrupt")


def test_missing_part_and_bad_pointer_are_refused(common, saved):
    _, model_dir, path = saved
    (path / "workers" / "rank-0.json").unlink()
    _refused(common, model_dir, CheckpointError, r"rank-0\.json is missing")
    (model_dir / "_checkpoint").write_text(json.dumps({"dt": "d0", "dir": "d0/9", "generation": 9}))
    _refused(common, model_dir, CheckpointError, r"names .*d0/9, which has no manifest\.json")


def test_format_version_and_another_models_manifest_are_refused(common, saved):
    _, model_dir, path = saved
    _refused(common, model_dir, MismatchError, r"dense tensor 'extra.weight': missing", extra=True)
    _refused(common, model_dir, MismatchError, r'table "emb": saved dim 4 != model dim 8', dim=8)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["feature_spec"]["columns"] = manifest["feature_spec"]["columns"][:1]
    (path / "manifest.json").write_bytes(_fileio.dumps_checked(manifest))  # a valid checksum
    _refused(common, model_dir, MismatchError, "feature spec or embedding layers differ")
    manifest["format_version"] = 7
    (path / "manifest.json").write_bytes(_fileio.dumps_checked(manifest))
    _refused(common, model_dir, FormatVersionError, "format_version 7 is not supported")


def test_warm_start_reports_what_was_loaded_skipped_and_initialized(common, saved):
    model, model_dir, _ = saved
    bigger = common.build(dim=8, extra=True)
    report = bigger.load_weights(str(model_dir), partial=True)
    assert "table wide" in report.loaded
    assert any(s.startswith("table emb (saved dim 4 != model dim 8") for s in report.initialized)
    assert any(s.startswith("dense extra.weight (missing") for s in report.initialized)
    assert any(s.startswith("dense mlp.0.weight (shape") for s in report.initialized)
    assert "dense mlp.2.bias" in report.loaded
    assert len(bigger.tables["emb"]) == 0 and len(bigger.tables["wide"]) == len(
        model.tables["wide"]
    )
    np.testing.assert_array_equal(
        bigger.tables["wide"].rows()["weights"], model.tables["wide"].rows()["weights"]
    )


def test_torch_rng_state_is_restored(common, tmp_path):
    import torch

    model = common.build()
    torch.manual_seed(123)
    model.save_weights(str(tmp_path / "m"), "d0")
    want = torch.rand(4)
    torch.manual_seed(999)
    common.build().load_weights(str(tmp_path / "m"))
    assert torch.equal(torch.rand(4), want)
