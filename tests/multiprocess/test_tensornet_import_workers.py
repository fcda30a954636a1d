"""Two workers under torchrun load one imported TensorNet checkpoint: each holds its own
buckets of the signs, together all of them, and both pull the imported weights."""

import os

import numpy as np

from tests.unit.compat.tensornet_writer import make_rows, write_checkpoint
from tnrec._hashing import bucket_of
from tnrec.compat.tensornet_import import import_checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_workers_share_the_imported_rows(launch, tmp_path):
    rows = make_rows("AdaGrad", 40, 3, seed=13)
    write_checkpoint(str(tmp_path / "tn"), "d", {"user": rows}, mode="bin", ranks=3)
    ckpt = str(tmp_path / "out")
    import_checkpoint(str(tmp_path / "tn"), ckpt, optimizer="AdaGrad")
    np.save(os.path.join(ckpt, "signs.npy"), rows.signs)
    res = launch(
        2, [str(tmp_path), ckpt], target=[os.path.join(HERE, "tensornet_import_scenario.py")]
    )
    assert res.returncode == 0, res.stdout + res.stderr
    parts = [dict(np.load(tmp_path / f"tn-import-rank{r}.npz")) for r in range(2)]
    keys = rows.signs.view(np.int64)
    for r, p in enumerate(parts):
        assert (bucket_of(p["keys"]) % 2 == r).all()  # a worker holds its own buckets
        np.testing.assert_allclose(p["prediction"], rows.w.astype(np.float64).sum(1), rtol=1e-6)
    both = np.sort(np.concatenate([p["keys"] for p in parts]))
    np.testing.assert_array_equal(both, np.sort(keys))
