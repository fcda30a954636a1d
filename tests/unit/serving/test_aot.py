"""The dense graph compiled ahead of time (torch._inductor AOT): same predictions, cached,
and a fallback to the exported program with the reason when it cannot be compiled."""

import os
import time

import numpy as np
import pytest

from tests.unit.serving.test_predictor_fast import wide_export, wide_rows  # noqa: F401
from tnrec.errors import ArgumentError
from tnrec.serving import Predictor
from tnrec.serving.graph import aot_graph


@pytest.fixture(scope="module")
def export_dir(wide_export):  # noqa: F811 - the fixture imported above
    return wide_export


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("aot_cache"))


@pytest.fixture(scope="module")
def compiled(export_dir, cache):
    return Predictor(export_dir, aot=True, aot_cache=cache)


def test_aot_predictions_equal_the_exported_programs(export_dir, compiled):
    plain = Predictor(export_dir)
    assert compiled.graph_kind == "aot", compiled.aot_error
    assert plain.graph_kind == "exported" and plain.aot_error is None
    for n in (1, 3, 64, 257):  # any batch size, one graph
        rows = wide_rows(n, 10 + n, unseen=True)
        np.testing.assert_allclose(compiled.predict(rows), plain.predict(rows), rtol=0, atol=1e-6)
    assert compiled.predict([]).shape == (0,)


def test_a_second_predictor_loads_the_cached_package(export_dir, cache, compiled):
    packages = [f for f in os.listdir(cache) if f.endswith(".pt2")]
    assert len(packages) == 1
    t0 = time.perf_counter()
    again = Predictor(export_dir, aot=True, aot_cache=cache)
    assert again.graph_kind == "aot"
    assert time.perf_counter() - t0 < 20  # a load, not a compile (which takes a minute here)
    assert os.listdir(cache) == [packages[0]]


def test_a_damaged_package_is_compiled_anew(export_dir, tmp_path, compiled):
    cache = str(tmp_path / "c")
    os.makedirs(cache)
    name = next(f for f in os.listdir(compiled.aot_cache) if f.endswith(".pt2"))
    with open(os.path.join(cache, name), "wb") as f:
        f.write(b"not a package")
    module, why = aot_graph(os.path.join(export_dir, "dense.pt2"), cache)
    assert why is None and module is not None
    assert os.path.getsize(os.path.join(cache, name)) > 1000


def test_without_a_compiler_it_falls_back_and_says_why(export_dir, tmp_path, monkeypatch):
    import torch._inductor.config as cfg

    monkeypatch.setattr(cfg, "force_disable_caches", True)  # no compiled code reused
    monkeypatch.setattr(cfg.cpp, "cxx", ("/nonexistent/c++",))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    p = Predictor(export_dir, aot=True, aot_cache=str(tmp_path / "none"))
    assert p.graph_kind == "exported"
    assert p.aot_error
    rows = wide_rows(5, 3)
    np.testing.assert_array_equal(p.predict(rows), Predictor(export_dir).predict(rows))


def test_bad_aot_arguments_are_refused(export_dir):
    with pytest.raises(ArgumentError, match="`aot` must be"):
        Predictor(export_dir, aot="yes")
    with pytest.raises(ArgumentError, match="`aot_cache`"):
        Predictor(export_dir, aot=True, aot_cache=3)
