"""`tnrec inspect` on damaged checkpoints: an error naming the file, never a raw traceback."""

import pytest

from tnrec.cli.inspection import inspect
from tnrec.errors import CheckpointError, ChecksumError


@pytest.fixture
def saved(common, tmp_path):
    model = common.build()
    model.fit(common.reader(common.write_day(str(tmp_path), 0)), verbose=0)
    model.save_weights(str(tmp_path / "m"), "d0")
    part = tmp_path / "m" / "d0" / "1" / "sparse" / "emb" / "part-00000-of-00001"
    return tmp_path / "m", part, int(model.tables["emb"].rows()["keys"][0])


def test_inspect_says_it_verified_the_checkpoint(saved):
    model_dir, _, _ = saved
    assert "the checksum of every file checked" in inspect(str(model_dir))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b"garbage" * 10, id="garbage"),
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="bit-flip"),
    ],
)
@pytest.mark.parametrize("name", ["keys.npy", "show.npy", "weights.npy"])
def test_inspect_names_a_damaged_part_file(saved, damage, name):
    model_dir, part, key = saved
    f = part / name
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(ChecksumError, match=rf"{name} is corrupt"):
        inspect(str(model_dir))
    with pytest.raises(ChecksumError, match=rf"{name} is corrupt"):
        inspect(str(model_dir), table="emb", key=str(key))


def test_inspect_names_a_missing_part_file(saved):
    model_dir, part, _ = saved
    (part / "click.npy").unlink()
    with pytest.raises(CheckpointError, match=r"click\.npy is missing"):
        inspect(str(model_dir))
