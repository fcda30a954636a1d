"""FlatGraph: the Predictor's dense graph runs directly after one checked call, bit for bit,
and keeps the checked module where the direct call would not give the same answer."""

import numpy as np
import pytest
import torch

from tests.unit.export.export_common import raw_rows, train_custom
from tnrec import _fileio
from tnrec.export import GRAPH
from tnrec.losses import PREDICTIONS
from tnrec.serving import Predictor
from tnrec.serving.graph import FlatGraph, load_program


@pytest.fixture(scope="module")
def custom_export(tmp_path_factory):
    """Two heads, sequences, pooled and cvm inputs: every kind of graph input."""
    return train_custom().export(str(tmp_path_factory.mktemp("custom") / "exp"))


def test_after_the_first_call_the_graph_runs_directly_and_answers_the_same(custom_export):
    p = Predictor(custom_export)
    assert isinstance(p.graph, FlatGraph) and p.graph._direct is None
    first = p.predict(raw_rows(5, 1))
    assert p.graph._direct is True
    again = Predictor(custom_export)  # a fresh one: every answer through the checked module
    again.graph._direct = False
    np.testing.assert_array_equal(again.predict(raw_rows(5, 1))["ctr"], first["ctr"])
    for n in (1, 2, 17, 300):  # any batch size after the first call
        rows = raw_rows(n, 10 + n)
        got, want = p.predict(rows), again.predict(rows)
        for head in ("ctr", "cvr"):
            np.testing.assert_array_equal(got[head], want[head])
        args = p.graph_inputs(rows)
        with torch.no_grad():
            direct, checked = p.graph(*args), p.graph.module(*args)
        assert len(direct) == len(checked) == 2
        for d, c in zip(direct, checked, strict=True):
            assert torch.equal(d, c)


def test_a_direct_call_that_answers_differently_keeps_the_checked_module(custom_export):
    p = Predictor(custom_export)
    args = Predictor(custom_export).graph_inputs(raw_rows(4, 2))
    p.graph._graph = lambda *a: tuple(torch.zeros(4) for _ in range(2))  # a wrong answer
    with torch.no_grad():
        out = p.graph(*args)
    assert p.graph._direct is False
    with torch.no_grad():
        assert all(torch.equal(o, c) for o, c in zip(out, p.graph.module(*args), strict=True))

    def fails(*a):
        raise RuntimeError("takes its arguments another way")

    q = Predictor(custom_export)
    q.graph._graph = fails
    want = Predictor(custom_export).predict(raw_rows(4, 2))
    got = q.predict(raw_rows(4, 2))
    assert q.graph._direct is False
    np.testing.assert_array_equal(got["cvr"], want["cvr"])


class _Counts(torch.nn.Module):
    """A graph that writes a buffer in place, through a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        self.calls.view(2, 1).add_(1)
        return (self.lin(x).squeeze(-1),)


class _WritesItsArgument(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        x.relu_()
        return (x.sum(-1),)


class _InplaceRelu(torch.nn.Module):
    """In-place ops on the graph's own intermediate tensors only."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.relu(self.lin(x)).sum(-1),)


def test_a_program_that_writes_a_buffer_always_runs_the_checked_module():
    program = torch.export.export(_Counts(), (torch.randn(2, 3),))
    g = FlatGraph(program)
    assert g._direct is False
    x = torch.randn(2, 3)
    with torch.no_grad():
        out = g(x)
        again = g(x)
    assert g._direct is False and torch.equal(out[0], again[0])
    assert g.module.calls.tolist() == [2.0, 2.0]  # both calls ran the module


def test_a_program_that_writes_its_argument_always_runs_the_checked_module():
    g = FlatGraph(torch.export.export(_WritesItsArgument(), (torch.randn(2, 3),)))
    assert g._direct is False
    x = torch.tensor([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]])
    with torch.no_grad():
        (out,) = g(x.clone())
    assert g._direct is False and out.tolist() == [2.0, 10.0]


def test_in_place_ops_on_intermediates_keep_the_direct_call():
    torch.manual_seed(0)
    module = _InplaceRelu().eval()
    g = FlatGraph(torch.export.export(module, (torch.randn(2, 3),)))
    assert g._direct is None
    with torch.no_grad():
        for x in (torch.randn(2, 3), torch.randn(2, 3)):
            (out,) = g(x)
            assert torch.equal(out, module(x)[0])
    assert g._direct is True


def test_the_direct_graph_holds_the_programs_weights(custom_export):
    program = load_program(_fileio.join(custom_export, GRAPH))
    g = FlatGraph(program)
    weights = {id(t) for t in program.state_dict.values()}
    assert weights and weights <= {id(t) for t in g._lifted}


def test_graph_inputs_are_what_predict_runs(custom_export):
    p = Predictor(custom_export)
    assert p.graph_inputs([]) == []
    rows = raw_rows(7, 5)
    args = p.graph_inputs(rows)
    assert all(isinstance(a, torch.Tensor) and a.shape[0] == 7 for a in args)
    with torch.no_grad():
        outs = p.graph(*args)
    got = p.predict(rows)
    assert [h["name"] for h in p.heads] == ["ctr", "cvr"]
    for head, out in zip(p.heads, outs, strict=True):
        want = PREDICTIONS[head["prediction"]](out).numpy()
        np.testing.assert_array_equal(got[head["name"]], want)
