"""The run config as typed dataclasses: sections, one-item lists, defaults, old config.json
files, the kinds read from the annotations, and the module doc listing every key."""

import json
import re

import pytest

from tnrec.cli import config
from tnrec.cli.config import (
    DataConfig,
    ModelConfig,
    RunConfig,
    config_from_dict,
    key_digests,
    load_config,
)
from tnrec.errors import ConfigError

# A config.json as `tnrec train` wrote it before the sections were dataclasses:
# the same nested shape, keys in the order of the TOML file.
OLD_CONFIG_JSON = {
    "seed": 1,
    "output_dir": "/r/out",
    "columns": "criteo",
    "model": {"hidden_units": [8], "embedding_dim": 4, "name": "widedeep", "cross_layers": 3},
    "data": {
        "dir": "/r/data",
        "train_days": ["2024-05-10"],
        "test": ["/r/data/test/*.parquet"],
        "format": "parquet",
        "train": None,
        "test_days": None,
        "pattern": None,
        "label": "label",
        "delimiter": ",",
        "header": True,
        "shuffle": True,
        "prefetch": 2,
        "on_bad_row": "raise",
    },
    "optimizer": {
        "sparse": {"type": "adagrad", "learning_rate": 0.05},
        "dense": {"type": "adam", "learning_rate": 0.001},
    },
    "train": {"epochs": 1, "batch_size": 200, "log_every": 1, "steps_per_epoch": None},
    "checkpoint": {"dir": None, "save_every_n_steps": None, "keep": None},
    "eviction": {
        "show_decay_rate": 0.98,
        "show_threshold": None,
        "max_unseen_days": None,
        "combine": "any",
    },
    "distributed": {"timeout_s": 300.0},
}


def test_sections_are_dataclasses_with_absolute_paths_and_one_item_lists():
    doc = {"model": {"name": "DCN"}, "data": {"train": "a/*.parquet", "dir": "d", "test_days": "x"}}
    cfg = config_from_dict(doc, "/r/run.toml")
    assert isinstance(cfg.model, ModelConfig) and isinstance(cfg.data, DataConfig)
    assert cfg.model == ModelConfig(name="dcn")  # the name lower-cased, the rest defaults
    assert cfg.data.train == ["/r/a/*.parquet"] and cfg.data.dir == "/r/d"
    assert cfg.data.test_days == ["x"] and cfg.has_test
    assert cfg.output_dir == "/r/runs/tnrec" and cfg.model_dir == "/r/runs/tnrec/model"
    assert cfg.optimizer.sparse == {"type": "adagrad", "learning_rate": 0.05}
    assert (cfg.train.batch_size, cfg.checkpoint.keep, cfg.distributed.timeout_s) == (
        4096,
        None,
        300.0,
    )


def test_defaults_are_not_shared_between_configs():
    a = config_from_dict({"data": {"train": "a"}}, "/r/run.toml")
    a.model.hidden_units.append(1)
    a.optimizer.sparse["learning_rate"] = 1.0
    b = config_from_dict({"data": {"train": "a"}}, "/r/run.toml")
    assert b.model.hidden_units == [400, 400, 400] and b.optimizer.sparse["learning_rate"] == 0.05


def test_a_config_json_written_before_the_dataclasses_reads_back(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OLD_CONFIG_JSON))
    cfg = load_config(path)
    assert cfg.model.name == "widedeep" and cfg.data.train_days == ["2024-05-10"]
    # keys added since read back as their defaults; every old key is kept as it was
    want = json.loads(json.dumps(OLD_CONFIG_JSON))
    want["eviction"].update(max_rows=None, low_water=0.95)
    want["distributed"].update(memory_limit_bytes=None, mode="sync", staleness=4)
    want["checkpoint"]["save_every_days"] = 1
    want["schedule"] = None
    want["data"]["compression"] = "auto"
    want["train"].update(pipeline=None, balance=False, device="cpu")
    want["admission"] = {
        "min_show": None,
        "probability": None,
        "sketch_bytes": 16 << 20,
        "read_unadmitted": "zeros",
    }
    assert cfg.to_dict() == want
    assert load_config(path, output_dir="/elsewhere").output_dir == "/elsewhere"
    again = tmp_path / "again.json"
    again.write_text(json.dumps(cfg.to_dict()))
    assert key_digests(load_config(again)) == key_digests(cfg)


def test_key_digests_name_every_leaf_key_in_a_fixed_order():
    cfg = config_from_dict(OLD_CONFIG_JSON, "/r/config.json")
    keys = [k for k, _ in key_digests(cfg)]
    assert keys[:5] == ["seed", "output_dir", "columns", "model.name", "model.embedding_dim"]
    assert "optimizer.sparse" in keys and "optimizer" not in keys and "data" not in keys
    assert keys[-2:] == ["distributed.staleness", "model_dir"] and len(keys) == 50
    assert "distributed.mode" in keys
    assert "admission.min_show" in keys and "eviction.max_rows" in keys


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        pytest.param(
            {"data": {"train": 3}},
            r'"data.train" must be str or list of strs. Received: 3 \(int\).',
            id="str-or-list",
        ),
        pytest.param(
            {"columns": 3}, r'"columns" must be str or list of tables. Received: 3', id="columns"
        ),
        pytest.param(
            {"optimizer": {"sparse": 3}}, r'"optimizer.sparse" must be table.', id="table"
        ),
        pytest.param(
            {"eviction": {"show_threshold": "1"}},
            r"\"eviction.show_threshold\" must be float. Received: '1' \(str\).",
            id="optional-float",
        ),
        pytest.param(
            {"data": {"header": 1}}, r'"data.header" must be bool. Received: 1 \(int\).', id="bool"
        ),
        pytest.param(
            {"data": {"label": None}},
            r'"data.label" must be str. Received: None \(NoneType\).',
            id="null-for-a-key-with-a-default",
        ),
        pytest.param(
            {"model": 3}, r'"model" must be a table \(\[model\]\). Received: 3.', id="section"
        ),
        pytest.param(
            {"source": "x"},
            r'unknown key "source". Valid keys here: admission, checkpoint, col',
            id="source",
        ),
    ],
)
def test_kinds_are_read_from_the_annotations(doc, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict(doc, "/r/run.toml")


FREE_FORM = ("optimizer.", "schedule.")  # tables whose keys are checked by make_*


def test_the_module_doc_lists_every_key():
    documented, section = set(), ""
    for line in (config.__doc__ or "").splitlines():
        if m := re.match(r"^    \[([\w.]+)\]", line):
            section = m.group(1) + "."
            if section.startswith(FREE_FORM):  # a free-form table: the table is the key
                documented.add(section[:-1])
        elif (m := re.match(r"^    (\w+) = ", line)) and not section.startswith(FREE_FORM):
            documented.add(section + m.group(1))
    keys = {k for k, _ in key_digests(RunConfig("/r/run.toml"))} - {"model_dir"}
    assert documented == keys


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"admission": {"min_show": 0.0}}, r"admission: AdmissionPolicy: `min_show` must be"),
        ({"admission": {"probability": 2.0}}, r"admission: .*`probability` must be in \(0, 1\]"),
        ({"admission": {"min_show": 2.0, "sketch_bytes": 10}}, r"admission: .*sketch_bytes"),
        ({"admission": {"min_show": 2.0, "read_unadmitted": "x"}}, r"read_unadmitted"),
        ({"eviction": {"max_rows": 100}}, r"eviction: .*`max_rows` must be an int >= 1024"),
        ({"eviction": {"max_rows": 4096, "low_water": 1.5}}, r"eviction: .*`low_water`"),
        ({"distributed": {"memory_limit_bytes": 0}}, r'"distributed.memory_limit_bytes" must be'),
    ],
)
def test_bad_admission_cap_and_memory_limit_values_name_the_section(doc, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"data": {"train": "a"}, **doc}, "/r/run.toml")


def test_admission_cap_and_memory_limit_build_the_policies():
    cfg = config_from_dict(
        {
            "data": {"train": "a"},
            "admission": {"min_show": 3, "read_unadmitted": "init"},
            "eviction": {"max_rows": 2048, "low_water": 0.5},
            "distributed": {"memory_limit_bytes": 1 << 30},
        },
        "/r/run.toml",
    )
    adm = config.make_admission(cfg)
    assert (adm.min_show, adm.probability, adm.read_unadmitted) == (3.0, None, "init")
    pol = config.make_policy(cfg)
    assert (pol.max_rows, pol.low_water) == (2048, 0.5)
    assert cfg.distributed.memory_limit_bytes == 1 << 30
    assert config.make_admission(config_from_dict({"data": {"train": "a"}}, "/r/x.toml")) is None
