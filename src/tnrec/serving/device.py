"""The Predictor's dense graph on a device: the graph there, its inputs moved, its outputs back.

The dictionaries stay on the host: keys are looked up and pooled there, and
only the graph's inputs (pooled rows ``[B, D]``, sequence grids ``[B, T, D]``
and lengths ``[B]``, dense features ``[B, F]``) cross to the device, through
:mod:`tnrec.layers.device`; the outputs come back before the predictions are
made numpy. On the CPU nothing moves (the default). The CUDA branch
(``torch.export.passes.move_to_device_pass``, pinned non-blocking copies) is
tested where CUDA exists: its predictions match the CPU's to 1e-5.
"""

from __future__ import annotations

from typing import Any

import torch

from tnrec.layers.device import to_device
from tnrec.serving.graph import load_graph, load_program


def load_graph_on(fname: str, device: torch.device) -> Any:
    """The dense graph of ``fname`` on ``device`` (the CPU: :func:`load_graph`'s
    :class:`~tnrec.serving.graph.FlatGraph`).

    Off the CPU the exported program is moved before it becomes a module, so
    its parameters, buffers, constants and the devices its ops name all move;
    the module checks every call's arguments.

    Raises:
        CheckpointError: the file is missing or damaged (names it).
    """
    if device.type == "cpu":
        return load_graph(fname)
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(load_program(fname), device).module()


def inputs_to(args: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The graph's host inputs on ``device`` (the CPU: ``args`` itself, nothing copied)."""
    if device.type == "cpu":
        return args
    return [to_device(a, device) for a in args]
