"""Predictor(device=...): the dense graph on a device, the dictionaries on the host.

This machine has no GPU: ``device="cpu"`` must be bit-equal to the default,
the meta device stands in for a GPU to run the move of the graph and its
inputs, and ``"cuda"`` must fail clearly where CUDA is not available (where it
is, the CUDA predictions must match the CPU's).
"""

import numpy as np
import pytest
import torch

from tests.unit.export.export_common import raw_rows, tiny_rows, train_custom
from tnrec import _fileio
from tnrec.errors import ArgumentError
from tnrec.export import GRAPH
from tnrec.serving import Predictor
from tnrec.serving.device import inputs_to, load_graph_on


@pytest.fixture(scope="module")
def custom_export(tmp_path_factory):
    """Two heads, sequences, pooled and cvm inputs: every kind of graph input."""
    return train_custom().export(str(tmp_path_factory.mktemp("custom") / "exp"))


def test_device_cpu_is_bit_equal_to_the_default(custom_export):
    rows = raw_rows(64, 3)
    want = Predictor(custom_export).predict(rows)
    for device in ("cpu", torch.device("cpu")):
        p = Predictor(custom_export, device=device)
        assert p.device == torch.device("cpu")
        got = p.predict(rows)
        assert sorted(got) == sorted(want) == ["ctr", "cvr"]
        for head in want:
            assert isinstance(got[head], np.ndarray) and got[head].dtype == np.float32
            np.testing.assert_array_equal(got[head], want[head])


def test_device_cpu_on_the_fast_path_is_bit_equal(tiny_export):
    rows = [{k: v for k, v in r.items() if k != "y"} for r in tiny_rows(40, 3)]
    np.testing.assert_array_equal(
        Predictor(tiny_export, device="cpu").predict(rows), Predictor(tiny_export).predict(rows)
    )


def test_cpu_inputs_are_not_copied():
    args = [torch.ones(2, 3), torch.zeros(2)]
    assert inputs_to(args, torch.device("cpu")) is args


def test_the_graph_and_its_inputs_move_off_the_cpu(custom_export):
    """The meta device runs the non-CPU branch: every parameter, buffer and output moves."""
    meta = torch.device("meta")
    graph = load_graph_on(_fileio.join(custom_export, GRAPH), meta)
    tensors = [*graph.parameters(), *graph.buffers()]
    assert tensors and {t.device.type for t in tensors} == {"meta"}
    cpu = load_graph_on(_fileio.join(custom_export, GRAPH), torch.device("cpu"))
    assert {p.device.type for p in cpu.module.parameters()} == {"cpu"}


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("tpu", r"Predictor: `device` must be \"cpu\", \"cuda\" or \"cuda:N\"\. .*device='tpu'"),
        ("cdua", r"`device` must be .* Received: device='cdua'"),
        ("meta", r"`device` must be .* Received: device='meta'"),
        (0, r"`device` must be .* Received: device=0 \(int\)"),
        (None, r"`device` must be .* Received: device=None \(NoneType\)"),
    ],
    ids=["tpu", "typo", "meta", "int", "None"],
)
def test_a_bad_device_names_the_argument(tiny_export, bad, match):
    with pytest.raises(ArgumentError, match=match):
        Predictor(tiny_export, device=bad)


def test_cuda_fails_clearly_without_cuda_and_matches_the_cpu_with_it(custom_export):
    rows = raw_rows(32, 4)
    if not torch.cuda.is_available():  # this machine
        with pytest.raises(
            ArgumentError, match=r"Predictor: `device` is 'cuda' but CUDA is not available"
        ):
            Predictor(custom_export, device="cuda")
        return
    want = Predictor(custom_export).predict(rows)  # a CUDA machine: not run here
    got = Predictor(custom_export, device="cuda").predict(rows)
    for head in want:
        np.testing.assert_allclose(got[head], want[head], rtol=1e-5, atol=1e-5)
