"""The scripts in examples/ run end to end on data they generate."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tensornet_wide_deep_trains_exports_and_serves_what_it_predicts(tmp_path):
    example = _load("tensornet_wide_deep")
    result = example.main(["--synthetic", "2000", "--out", str(tmp_path)])
    # the synthetic labels follow a hidden logistic model: two small days learn some of it
    assert result["test_auc"] > 0.52
    assert result["max_abs_diff"] < 1e-5
    assert (tmp_path / "model" / "_checkpoint").is_file()
