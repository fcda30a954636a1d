"""`tnrec train` with `dtype = "sign"` columns: the signs' 64 bits are the table's keys."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.unit.cli.test_cli import last_json, write_config
from tnrec.cli import main
from tnrec.export import load_dictionary, read_manifest
from tnrec.serving import Predictor

SIGNS = np.array([1, 2**63, 2**64 - 1, 12345678901234567890, 7], dtype=np.uint64)

TOML = """\
output_dir = "run"
[model]
name = "lr"
[[columns]]
type = "category"
key = "slot"
dtype = "sign"
[data]
train = "train.parquet"
[train]
batch_size = 4
"""


def test_sign_columns_from_a_run_config_key_the_rows_by_their_bits(tmp_path, capsys):
    rows = np.tile(SIGNS, 4)  # [20], every sign 4 times
    labels = (np.arange(rows.size) % 2).astype(np.float32)
    pq.write_table(
        pa.table({"slot": pa.array(rows, pa.uint64()), "label": labels}),
        tmp_path / "train.parquet",
    )
    assert main(["train", "--config", write_config(tmp_path, TOML)]) == 0
    assert last_json(capsys)["rows"] == rows.size
    spec = json.loads((tmp_path / "run" / "model" / "model.json").read_text())["feature_spec"]
    assert spec["format_version"] == 2
    assert spec["columns"][0]["dtype"] == "sign"
    out = tmp_path / "export"
    model_dir = str(tmp_path / "run" / "model")
    assert main(["export", "--model-dir", model_dir, "--out", str(out), "--format", "tsv"]) == 0
    manifest = read_manifest(str(out))
    for table in manifest["tables"]:
        keys, _ = load_dictionary(str(out), table, manifest)
        assert sorted(keys.tolist()) == sorted(SIGNS.view(np.int64).tolist())
    # the text dictionaries print the signs as TensorNet does: unsigned decimal
    lines = [ln for f in sorted((out / "tsv").rglob("*.tsv")) for ln in f.read_text().splitlines()]
    assert sorted({int(ln.split("\t")[0]) for ln in lines}) == sorted(int(s) for s in SIGNS)
    pred = Predictor(str(out)).predict([{"slot": int(s)} for s in SIGNS])
    assert np.all(np.isfinite(pred)) and len(pred) == SIGNS.size
