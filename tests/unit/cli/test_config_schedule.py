"""The run config's ``[schedule]`` and ``checkpoint.save_every_days``, and ``tnrec train``
with both: errors name the key; days between saves are trained, not saved."""

import json

import pytest

from tests.unit.cli.test_cli import TOML, data_dir, write_config  # noqa: F401 (data_dir: fixture)
from tnrec import checkpoint
from tnrec.cli import main
from tnrec.cli.config import load_config, make_schedule
from tnrec.errors import ConfigError
from tnrec.schedules import CosineDecay, WarmUp

SCHEDULE = """
[schedule]
type = "warmup"
steps = 3
start_factor = 0.5
then = {type = "CosineDecay", decay_steps = 4, min_factor = 0.25}
"""


def test_schedule_and_save_every_days_are_read(tmp_path):
    text = TOML + SCHEDULE + "\n[checkpoint]\nsave_every_days = 2\n"
    cfg = load_config(write_config(tmp_path, text))
    assert make_schedule(cfg) == WarmUp(3, 0.5, then=CosineDecay(4, 0.25))
    assert cfg.checkpoint.save_every_days == 2
    again = load_config(write_config(tmp_path, json.dumps(cfg.to_dict()), "config.json"))
    assert make_schedule(again) == make_schedule(cfg)


def test_without_a_schedule_there_is_none_and_every_day_is_saved(tmp_path):
    cfg = load_config(write_config(tmp_path))
    assert make_schedule(cfg) is None and cfg.checkpoint.save_every_days == 1


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ('\n[schedule]\ntype = "linear"\n', r"schedule: `type` must be one of .*type='linear'"),
        (
            '\n[schedule]\ntype = "stepdecay"\nstep_size = 2\ngama = 0.5\n',
            r"schedule: StepDecay takes \['step_size', 'gamma', 'min_factor'\]; unknown "
            r"argument\(s\) \['gama'\]",
        ),
        (
            '\n[schedule]\ntype = "warmup"\nsteps = 0\n',
            r"schedule: WarmUp: `steps` must be an int >= 1\. Received: steps=0",
        ),
        (
            '\n[schedule]\ntype = "warmup"\nsteps = 2\nthen = {type = "cosinedecay"}\n',
            r"schedule\.then: CosineDecay: .*decay_steps",
        ),
        ("\nschedule = 3\n", r'"schedule" must be table\. Received: 3'),
        (
            "\n[checkpoint]\nsave_every_days = 0\n",
            r'"checkpoint.save_every_days" must be >= 1\. Received: 0',
        ),
        (
            "\n[checkpoint]\nsave_every_day = 2\n",
            r'unknown key "checkpoint.save_every_day"; did you mean "checkpoint.save_every_days"',
        ),
    ],
    ids=["type", "argument", "value", "nested", "not-a-table", "days-range", "days-typo"],
)
def test_config_errors_name_the_key(tmp_path, extra, match):
    top = extra.startswith("\nschedule")
    text = TOML.replace("seed = 1\n", "seed = 1\n" + extra) if top else TOML + extra
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_config(path)
    assert path in str(info.value)


def test_train_saves_every_second_day_and_the_last_with_a_schedule(data_dir, tmp_path, capsys):  # noqa: F811
    three = TOML.replace("epochs = 2", "epochs = 1").replace(
        '"2024-05-11"]', '"2024-05-11", "2024-05-12"]'
    )
    text = three + SCHEDULE + "\n[checkpoint]\nsave_every_days = 2\n"
    out = tmp_path / "run"
    (tmp_path / "data").symlink_to(data_dir / "data")
    assert main(["train", "--config", write_config(tmp_path, text), "--output-dir", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    day_lines = [line for line in lines if line.startswith("day ")]
    assert [line.endswith("(not saved)") for line in day_lines] == [True, False, False]
    gens = checkpoint.generations(str(out / "model"))
    assert [dt for dt, _ in gens] == ["2024-05-11", "2024-05-12"]
    resume = checkpoint.read_manifest(checkpoint.latest(str(out / "model")))["resume"]
    # 1,000 rows a day in batches of 500: 6 steps; the last ran at global step 5, where
    # the warm-up (3 steps) is over and the cosine is 2 of 4 steps in: 0.25 + 0.75 / 2
    assert resume["global_step"] == 6
    (rate,) = set(resume["learning_rates"].values())
    assert rate == pytest.approx(0.05 * 0.625, rel=1e-12)
