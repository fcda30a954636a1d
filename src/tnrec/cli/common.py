"""What the commands share: the strategy, argument checks, strict JSON, building the zoo model."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tnrec import _fileio
from tnrec.cli.config import (
    ConfigError,
    RunConfig,
    make_admission,
    make_columns,
    make_optimizer,
    make_policy,
)
from tnrec.distribute import PsStrategy, current_strategy
from tnrec.errors import ArgumentError, WriteError
from tnrec.models import ZooModel, build

CONFIG_FILE = "config.json"
GLOB_DAY = "train"  # the day label of a config with data.train globs instead of days


def current_or_new_strategy(
    timeout_s: float | None = None,
    memory_limit_bytes: int | None = None,
    mode: str = "sync",
    staleness: int = 4,
) -> PsStrategy:
    """The current strategy; created on first use from the launcher's environment.

    ``timeout_s`` (``distributed.timeout_s``, or ``--timeout-s``) is the
    collective timeout of the process group this creates and
    ``memory_limit_bytes`` (``distributed.memory_limit_bytes``) the limit of
    this worker's tables, ``mode`` and ``staleness`` (``distributed.mode``,
    ``distributed.staleness``) sync or async training; an existing strategy is kept.
    """
    s = current_strategy()
    if s is not None:
        return s
    kwargs: dict[str, Any] = {"mode": mode, "staleness": staleness}
    if memory_limit_bytes is not None:
        kwargs["memory_limit_bytes"] = memory_limit_bytes
    if timeout_s is not None:
        kwargs["timeout_s"] = timeout_s
    return PsStrategy(**kwargs)


# ----------------------------------------------------------------- checks of numbers, paths, JSON


def _number_problem(value: Any, kind: type, minimum: float, above: bool) -> str | None:
    """What is wrong with ``value`` as a finite ``kind`` >= ``minimum`` (> with ``above``)."""
    # An int is finite; math.isfinite would overflow on one too large for a float.
    ok = (
        isinstance(value, (int, float) if kind is float else int)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))
        and (value > minimum if above else value >= minimum)
    )
    if ok:
        return None
    what = "an int" if kind is int else "a finite number"
    return f"must be {what} {'>' if above else '>='} {minimum:g}"


def check_number(
    name: str, value: Any, kind: type = float, minimum: float = 0, above: bool = False
) -> Any:
    """Return ``value`` if it is a finite ``kind`` >= ``minimum`` (> ``minimum`` with ``above``).

    Raises:
        ArgumentError: otherwise, naming ``name``.
    """
    problem = _number_problem(value, kind, minimum, above)
    if problem is not None:
        raise ArgumentError(f"{name} {problem}. Received: {value!r}.")
    return value


def number_arg(kind: type, minimum: float = 0, above: bool = False) -> Callable[[str], Any]:
    """Return an argparse ``type=`` that parses a finite ``kind`` >= ``minimum`` (> with ``above``).

    NaN, infinities, values out of range and text that is not a ``kind`` are
    refused with argparse's usage error (exit 2), naming the flag.
    """

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = text
        problem = _number_problem(value, kind, minimum, above)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}. Received: {text!r}.")
        return value

    return parse


def dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a directory (a file is in the way)."""
    if _fileio.is_remote(path):
        try:
            there = _fileio.is_file(path)
        except OSError as e:
            return f"cannot reach {path}: {e}"
        return f"{path} is an existing file, not a directory" if there else None
    path = os.path.abspath(path)
    if os.path.exists(path):
        return None if os.path.isdir(path) else f"{path} is an existing file, not a directory"
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{path} cannot be created: {parent} is a file, not a directory"
    return None


def make_dir(path: str, label: str) -> None:
    """Create directory ``path``; an error names ``label`` (the key or flag) and the path."""
    problem = dir_problem(path)
    if problem is None:
        try:
            _fileio.makedirs(path)
        except WriteError as e:
            problem = str(e).rstrip(".")
    if problem is not None:
        raise ConfigError(f"{label}: {problem}.")


def _finite_or_null(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, inf) replaced by None; numpy scalars as Python."""
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_json(obj: Any, **kwargs: Any) -> str:
    """Return ``obj`` as strict JSON: a non-finite number becomes ``null``."""
    return json.dumps(_finite_or_null(obj), allow_nan=False, **kwargs)


def model_params(cfg: RunConfig) -> dict[str, Any]:
    """The constructor arguments of the configured model (besides columns and optimizers)."""
    m = cfg.model
    params: dict[str, Any] = {"seed": cfg.seed}
    if m.name != "lr":
        params.update(embedding_dim=m.embedding_dim, hidden_units=list(m.hidden_units))
    if m.name == "dcn":
        params["cross_layers"] = m.cross_layers
    return params


def build_model(cfg: RunConfig) -> ZooModel:
    """Return the configured zoo model with its eviction policy, compiled (logit loss, auc).

    Build it after :class:`~tnrec.distribute.PsStrategy` to shard its tables.
    """
    torch.manual_seed(cfg.seed)
    model = build(
        cfg.model.name,
        make_columns(cfg),
        sparse_optimizer=make_optimizer(cfg, "sparse"),
        dense_optimizer=make_optimizer(cfg, "dense"),
        **model_params(cfg),
    )
    policy, admission = make_policy(cfg), make_admission(cfg)
    for layer in model.embedding_layers():
        layer.policy = policy
        layer.admission = admission
    model.compile()
    return model
