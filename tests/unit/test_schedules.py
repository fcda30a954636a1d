"""The built-in learning-rate schedules: factors by hand, configs, bad arguments."""

import json
import math

import pytest

from tnrec.errors import ArgumentError
from tnrec.schedules import (
    CosineDecay,
    ExponentialDecay,
    StepDecay,
    WarmUp,
    schedule_from_config,
)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # 0.1 + 0.9 * t / 3 for t < 3, then 1
        (WarmUp(3, start_factor=0.1), [0.1, 0.4, 0.7, 1.0, 1.0]),
        (WarmUp(2), [0.0, 0.5, 1.0, 1.0, 1.0]),
        # 0.5 ** (t / 2), floor 0.3: 1, 0.7071, 0.5, 0.3536, 0.3 (0.25 floored)
        (
            ExponentialDecay(2, 0.5, min_factor=0.3),
            [1.0, 0.5**0.5, 0.5, 0.5**1.5, 0.3],
        ),
        (ExponentialDecay(2, 0.5, staircase=True), [1.0, 1.0, 0.5, 0.5, 0.25]),
        # 0.1 ** (t // 2), floor 0.05: 1, 1, 0.1, 0.1, 0.05 (0.01 floored)
        (StepDecay(2, 0.1, min_factor=0.05), [1.0, 1.0, 0.1, 0.1, 0.05]),
        # 0.2 + 0.8 * (1 + cos(pi * t / 4)) / 2: 1, 0.8828, 0.6, 0.3172, 0.2
        (
            CosineDecay(4, min_factor=0.2),
            [1.0, 0.2 + 0.4 * (1 + 2**-0.5), 0.6, 0.2 + 0.4 * (1 - 2**-0.5), 0.2],
        ),
        # warm-up over 2 steps from 0.5, then halving every 2 steps counted from step 2
        (WarmUp(2, 0.5, then=StepDecay(2, 0.5)), [0.5, 0.75, 1.0, 1.0, 0.5]),
    ],
    ids=["warmup", "warmup-from-0", "exp", "exp-staircase", "step", "cosine", "warmup-then-step"],
)
def test_factors_match_hand_computed_values(schedule, expected):
    got = [schedule(t) for t in range(5)]
    assert got == pytest.approx(expected, rel=1e-15, abs=1e-15)


def test_cosine_stays_at_its_floor_after_the_decay():
    s = CosineDecay(10, min_factor=0.1)
    assert s(10) == pytest.approx(0.1) and s(1000) == pytest.approx(0.1)
    assert s(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize(
    "schedule",
    [
        WarmUp(5, 0.25, then=CosineDecay(7, 0.1)),
        ExponentialDecay(3, 0.9, min_factor=0.2, staircase=True),
        StepDecay(4, 0.5),
        WarmUp(2, then=WarmUp(3, then=ExponentialDecay(2, 0.5))),
    ],
    ids=["warmup-cosine", "exp", "step", "nested"],
)
def test_config_round_trips_through_json(schedule):
    config = json.loads(json.dumps(schedule.get_config()))
    again = schedule_from_config(config)
    assert again == schedule
    assert [again(t) for t in range(20)] == [schedule(t) for t in range(20)]


def test_config_type_is_case_insensitive():
    assert schedule_from_config({"type": "stepdecay", "step_size": 3, "gamma": 0.5}) == StepDecay(
        3, 0.5
    )


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: WarmUp(0), r"WarmUp: `steps` must be an int >= 1\. Received: steps=0"),
        (lambda: WarmUp(True), r"WarmUp: `steps` must be an int >= 1\. Received: steps=True"),
        (
            lambda: WarmUp(3, start_factor=1.5),
            r"WarmUp: `start_factor` must be a number in \[0, 1\]\. Received: start_factor=1.5",
        ),
        (lambda: WarmUp(3, then=0.5), r"WarmUp: `then` must be a tnrec schedule or None"),
        (
            lambda: ExponentialDecay(10, 0.0),
            r"ExponentialDecay: `decay_rate` must be a number in \(0, 1\]\. Received: "
            r"decay_rate=0.0",
        ),
        (
            lambda: ExponentialDecay(10, 0.5, staircase=1),
            r"ExponentialDecay: `staircase` must be a bool\. Received: 1",
        ),
        (
            lambda: StepDecay(2, 0.5, min_factor=float("nan")),
            r"StepDecay: `min_factor` must be a number in \[0, 1\]\. Received: min_factor=nan",
        ),
        (lambda: StepDecay(2.0, 0.5), r"StepDecay: `step_size` must be an int >= 1"),
        (lambda: CosineDecay(-1), r"CosineDecay: `decay_steps` must be an int >= 1"),
        (lambda: schedule_from_config([1]), r"schedule: a schedule must be a table"),
        (
            lambda: schedule_from_config({"type": "Linear"}),
            r"schedule: `type` must be one of \['CosineDecay', 'ExponentialDecay', 'StepDecay', "
            r"'WarmUp'\]\. Received: type='Linear'",
        ),
        (
            lambda: schedule_from_config({"type": "StepDecay", "step_size": 2, "gama": 0.5}),
            r"schedule: StepDecay takes \['step_size', 'gamma', 'min_factor'\]; unknown "
            r"argument\(s\) \['gama'\]",
        ),
        (
            lambda: schedule_from_config({"type": "CosineDecay"}),
            r"schedule: CosineDecay: .*decay_steps",
        ),
        (
            lambda: schedule_from_config({"type": "WarmUp", "steps": 2, "then": {"type": "X"}}),
            r"schedule\.then: `type` must be one of",
        ),
    ],
    ids=[
        "steps-0",
        "steps-bool",
        "start-factor",
        "then",
        "rate-0",
        "staircase",
        "min-nan",
        "step-float",
        "cosine-steps",
        "not-a-table",
        "unknown-type",
        "unknown-arg",
        "missing-arg",
        "nested-type",
    ],
)
def test_bad_arguments_are_refused_by_name(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()
