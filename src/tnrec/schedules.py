"""Learning-rate schedules: the factor of each optimizer's base learning rate at a step.

A schedule maps the global training step ``t`` (``Model.global_step`` before
the step runs: 0 for the first step ever, the same on every worker, saved in
checkpoints) to a factor; :class:`tnrec.callbacks.LearningRateScheduler` sets
every optimizer's learning rate to ``base_lr * schedule(t)`` before each step,
where ``base_lr`` is the optimizer's configured rate (dense and sparse alike).

* :class:`WarmUp`: ``start_factor + (1 - start_factor) * t / steps`` for
  ``t < steps``, then ``then(t - steps)`` (1 without ``then``).
* :class:`ExponentialDecay`: ``max(min_factor, decay_rate ** (t / decay_steps))``
  (``t // decay_steps`` with ``staircase``).
* :class:`StepDecay`: ``max(min_factor, gamma ** (t // step_size))``.
* :class:`CosineDecay`: ``min_factor + (1 - min_factor) * (1 + cos(pi * min(t, decay_steps)
  / decay_steps)) / 2``.

Every schedule has ``get_config()``; :func:`schedule_from_config` rebuilds it
(the run config's ``[schedule]`` table builds one through it).

Example:
    >>> s = WarmUp(4, start_factor=0.2, then=StepDecay(step_size=10, gamma=0.5))
    >>> [round(s(t), 3) for t in (0, 2, 4, 14, 24)]
    [0.2, 0.6, 1.0, 0.5, 0.25]
    >>> schedule_from_config(s.get_config()) == s
    True
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, fields
from typing import Any

from tnrec.errors import ArgumentError

__all__ = [
    "CosineDecay",
    "ExponentialDecay",
    "Schedule",
    "StepDecay",
    "WarmUp",
    "schedule_from_config",
]


def _int_at_least(cls: str, name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentError(
            f"{cls}: `{name}` must be an int >= {least}. Received: {name}={value!r}."
        )


def _in_range(cls: str, name: str, value: Any, low: float, high: float, low_open: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and value <= high
    if not ok:
        lo = "(" if low_open else "["
        raise ArgumentError(
            f"{cls}: `{name}` must be a number in {lo}{low:g}, {high:g}]. "
            f"Received: {name}={value!r}."
        )


@dataclass(frozen=True)
class Schedule(abc.ABC):
    """Base of the schedules: ``schedule(step)`` is the factor of the base learning rate."""

    @abc.abstractmethod
    def __call__(self, step: int) -> float:
        """Return the factor of the base learning rate at global step ``step`` (>= 0)."""

    def get_config(self) -> dict[str, Any]:
        """Return a JSON-ready description: ``type`` and the arguments (nested ``then``)."""
        out: dict[str, Any] = {"type": type(self).__name__}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.get_config() if isinstance(v, Schedule) else v
        return out


@dataclass(frozen=True)
class WarmUp(Schedule):
    """Linear warm-up from ``start_factor`` to 1 over ``steps`` steps, then ``then``.

    Args:
        steps: warm-up length (>= 1); step ``steps`` is the first at the full rate.
        start_factor: the factor at step 0, in ``[0, 1]``.
        then: the schedule after the warm-up, counted from its end (1 when None).

    Example:
        >>> [WarmUp(4, start_factor=0.0)(t) for t in range(6)]
        [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    """

    steps: int
    start_factor: float = 0.0
    then: Schedule | None = None

    def __post_init__(self) -> None:
        _int_at_least("WarmUp", "steps", self.steps, 1)
        _in_range("WarmUp", "start_factor", self.start_factor, 0.0, 1.0, low_open=False)
        if self.then is not None and not isinstance(self.then, Schedule):
            raise ArgumentError(
                f"WarmUp: `then` must be a tnrec schedule or None. Received: {self.then!r}."
            )

    def __call__(self, step: int) -> float:
        if step < self.steps:
            return self.start_factor + (1.0 - self.start_factor) * step / self.steps
        return 1.0 if self.then is None else self.then(step - self.steps)


@dataclass(frozen=True)
class ExponentialDecay(Schedule):
    """``max(min_factor, decay_rate ** (step / decay_steps))`` (Keras's ExponentialDecay).

    Args:
        decay_steps: steps per factor ``decay_rate`` (>= 1).
        decay_rate: in ``(0, 1]``.
        min_factor: the floor, in ``[0, 1]``.
        staircase: decay in whole periods (``step // decay_steps``).

    Example:
        >>> ExponentialDecay(decay_steps=10, decay_rate=0.5)(20)
        0.25
    """

    decay_steps: int
    decay_rate: float
    min_factor: float = 0.0
    staircase: bool = False

    def __post_init__(self) -> None:
        _int_at_least("ExponentialDecay", "decay_steps", self.decay_steps, 1)
        _in_range("ExponentialDecay", "decay_rate", self.decay_rate, 0.0, 1.0, low_open=True)
        _in_range("ExponentialDecay", "min_factor", self.min_factor, 0.0, 1.0, low_open=False)
        if not isinstance(self.staircase, bool):
            raise ArgumentError(
                f"ExponentialDecay: `staircase` must be a bool. Received: {self.staircase!r}."
            )

    def __call__(self, step: int) -> float:
        periods = step // self.decay_steps if self.staircase else step / self.decay_steps
        return max(self.min_factor, self.decay_rate**periods)


@dataclass(frozen=True)
class StepDecay(Schedule):
    """``max(min_factor, gamma ** (step // step_size))`` (torch's StepLR).

    Args:
        step_size: steps between two drops (>= 1).
        gamma: factor per drop, in ``(0, 1]``.
        min_factor: the floor, in ``[0, 1]``.

    Example:
        >>> [StepDecay(step_size=2, gamma=0.1)(t) for t in (0, 1, 2, 4)]
        [1.0, 1.0, 0.1, 0.010000000000000002]
    """

    step_size: int
    gamma: float
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        _int_at_least("StepDecay", "step_size", self.step_size, 1)
        _in_range("StepDecay", "gamma", self.gamma, 0.0, 1.0, low_open=True)
        _in_range("StepDecay", "min_factor", self.min_factor, 0.0, 1.0, low_open=False)

    def __call__(self, step: int) -> float:
        return max(self.min_factor, self.gamma ** (step // self.step_size))


@dataclass(frozen=True)
class CosineDecay(Schedule):
    """Half a cosine from 1 down to ``min_factor`` over ``decay_steps``, then ``min_factor``.

    Args:
        decay_steps: steps of the decay (>= 1).
        min_factor: the floor, in ``[0, 1]`` (Keras's ``alpha``).

    Example:
        >>> [CosineDecay(decay_steps=4, min_factor=0.2)(t) for t in (0, 2, 4, 9)]
        [1.0, 0.6000000000000001, 0.2, 0.2]
    """

    decay_steps: int
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        _int_at_least("CosineDecay", "decay_steps", self.decay_steps, 1)
        _in_range("CosineDecay", "min_factor", self.min_factor, 0.0, 1.0, low_open=False)

    def __call__(self, step: int) -> float:
        done = min(step, self.decay_steps) / self.decay_steps
        return self.min_factor + (1.0 - self.min_factor) * 0.5 * (1.0 + math.cos(math.pi * done))


SCHEDULES: dict[str, type[Schedule]] = {
    c.__name__: c for c in (WarmUp, ExponentialDecay, StepDecay, CosineDecay)
}
"""The built-in schedules by class name (the ``type`` of a config, any case)."""
_BY_LOWER = {name.lower(): name for name in SCHEDULES}


def schedule_from_config(config: dict[str, Any], where: str = "schedule") -> Schedule:
    """Rebuild a schedule from :meth:`Schedule.get_config` output (nested ``then`` too).

    Args:
        config: ``{"type": "WarmUp", "steps": 100, ...}``.
        where: what errors name (a config key, a file).

    Raises:
        ArgumentError: not a table, an unknown ``type`` or argument, or a bad value.
    """
    if not isinstance(config, dict):
        raise ArgumentError(f"{where}: a schedule must be a table. Received: {config!r}.")
    cfg = dict(config)
    name = cfg.pop("type", None)
    name = _BY_LOWER.get(name.lower(), name) if isinstance(name, str) else name
    if name not in SCHEDULES:
        raise ArgumentError(
            f"{where}: `type` must be one of {sorted(SCHEDULES)}. Received: type={name!r}."
        )
    cls = SCHEDULES[name]
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        raise ArgumentError(f"{where}: {name} takes {allowed}; unknown argument(s) {unknown}.")
    if isinstance(cfg.get("then"), dict):
        cfg["then"] = schedule_from_config(cfg["then"], f"{where}.then")
    try:
        return cls(**cfg)
    except TypeError as e:  # a required argument left out
        raise ArgumentError(f"{where}: {name}: {e}.") from None
    except ArgumentError as e:
        raise ArgumentError(f"{where}: {e}") from None
