"""parse_device / check_device: the form of a device, and whether this process has it."""

import pytest
import torch

from tnrec.errors import ArgumentError
from tnrec.layers.device import check_device, parse_device


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("cpu", torch.device("cpu")),
        (torch.device("cpu"), torch.device("cpu")),
        ("cuda", torch.device("cuda")),
        ("cuda:1", torch.device("cuda", 1)),
    ],
    ids=["cpu", "torch-cpu", "cuda", "cuda:1"],
)
def test_the_form_parses_without_the_device(given, want):
    assert parse_device(given) == want


@pytest.mark.parametrize(
    "bad", ["gpu", "meta", "mps", "", 0, None], ids=["gpu", "meta", "mps", "empty", "0", "None"]
)
def test_another_form_names_the_argument_and_the_choices(bad):
    with pytest.raises(ArgumentError, match=r'`device` must be "cpu", "cuda" or "cuda:N"\. Rec'):
        check_device(bad)


def test_cuda_needs_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ArgumentError, match=r"`device` is 'cuda:0' but CUDA is not available"):
        check_device("cuda:0")
    assert check_device("cpu") == torch.device("cpu")


def test_an_index_past_the_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rule, without a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == torch.device("cuda", 1)
    assert check_device("cuda") == torch.device("cuda")
    with pytest.raises(ArgumentError, match=r"`device` is 'cuda:2' but this machine has 2 CUDA"):
        check_device("cuda:2")
