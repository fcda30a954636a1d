"""The run configuration of ``tnrec train``: a TOML file, validated key by key.

Every key, with its default::

    seed = 0                       # torch init, reader shuffle
    output_dir = "runs/tnrec"      # relative paths are relative to the config file
    columns = "criteo"             # or [[columns]] tables, the feature-spec fields:
    # [[columns]]
    # type = "category"            # category | numeric | bucketized
    # key = "user_id"
    # dtype = "int"                # category: int | str
    # embedding_share = "user"     # category, optional
    # default = 0.0                # numeric, bucketized
    # transforms = [{type = "log1p"}, {type = "standardize", mean = 1.0, std = 2.0}]
    # boundaries = [18.0, 25.0]    # bucketized

    [model]
    name = "deepfm"                # lr | widedeep | deepfm | dcn
    embedding_dim = 16
    hidden_units = [400, 400, 400]
    cross_layers = 3               # dcn

    [data]
    format = "parquet"             # parquet | csv | criteo
    train = ["data/2024-05-*/*.parquet"]   # files/globs; or dir + train_days (+ pattern)
    test = "data/test/*.parquet"           # or dir + test_days; optional
    dir = "data"
    train_days = ["2024-05-10"]
    test_days = ["2024-05-11"]
    pattern = "*.parquet"          # default by format: *.parquet, *.csv, *
    label = "label"
    delimiter = ","                # csv
    header = true                  # csv
    shuffle = true                 # training data, deterministic given seed
    prefetch = 2
    on_bad_row = "raise"           # raise | skip: a row that cannot be decoded (every reader)

    [optimizer.sparse]             # the tables': adagrad | adam | sgd | ftrl + hyper-parameters
    type = "adagrad"
    learning_rate = 0.05
    [optimizer.dense]              # the dense layers': adagrad | adam | sgd
    type = "adam"
    learning_rate = 0.001

    [train]
    epochs = 1                     # passes over each day (>= 1)
    batch_size = 4096
    steps_per_epoch = 100          # optional; not with the daily cycle of ``tnrec train``
    log_every = 100                # steps between log lines

    [checkpoint]                   # the model dir is a checkpoint root (tnrec.checkpoint)
    dir = "runs/tnrec/model"       # default: <output_dir>/model
    save_every_n_steps = 1000      # optional: mid-day checkpoints (resume inside a day)
    keep = 5                       # optional: keep this many newest generations

    [eviction]                     # every table's decay and eviction (tnrec.table.EvictionPolicy)
    show_decay_rate = 0.98         # show/click factor per day, before each day's save
    show_threshold = 1.0           # optional: evict rows whose decayed show is below this
    max_unseen_days = 30           # optional: evict rows not pushed for more days than this
    combine = "any"                # any | all

    [distributed]                  # under torchrun (tnrec.distribute.PsStrategy)
    timeout_s = 300.0              # a collective not done within this fails, naming rank and phase

Integers are checked against their range (``seed`` >= 0; ``embedding_dim``,
``hidden_units``, ``epochs``, ``batch_size``, ``log_every``,
``save_every_n_steps``, ``keep`` >= 1; ``cross_layers``, ``prefetch`` >= 0);
every float, here and in ``[optimizer.*]``, must be finite (TOML's ``nan``
and ``inf`` are refused).

``data.train_days`` are trained in order, one checkpoint per day; with
``data.train`` globs the whole input is one day labelled ``"train"``. An
unknown key is an error that names the closest valid key. Every input (each
training day, the test data) must match files that hold at least one row;
:func:`check_inputs` checks them all before training starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tnrec.data import Reader, criteo_columns, list_files, read_criteo, read_csv, read_parquet
from tnrec.errors import ArgumentError, ConfigError, DataError, SpecError
from tnrec.feature_column import HASH_NAME, SPEC_FORMAT, SPEC_VERSION, Column, from_spec
from tnrec.models import MODELS
from tnrec.optimizer import SparseOptimizer
from tnrec.table import OPTIMIZERS, EvictionPolicy

__all__ = [
    "RunConfig",
    "check_inputs",
    "config_from_dict",
    "day_files",
    "input_files",
    "key_digests",
    "load_config",
    "make_columns",
    "make_optimizer",
    "make_policy",
]

MODEL_NAMES = tuple(MODELS)
FORMATS = ("parquet", "csv", "criteo")
DEFAULT_PATTERN = {"parquet": "*.parquet", "csv": "*.csv", "criteo": "*"}
BAD_ROW_MODES = ("raise", "skip")


@dataclass(frozen=True)
class Field:
    """One config key: the accepted kinds (``int``, ``str``, ``[int]``, ``table``...), default."""

    kinds: tuple[str, ...]
    default: Any = None


SCHEMA: dict[str, Any] = {
    "seed": Field(("int",), 0),
    "output_dir": Field(("str",), "runs/tnrec"),
    "columns": Field(("str", "[table]"), "criteo"),
    "model": {
        "name": Field(("str",), "deepfm"),
        "embedding_dim": Field(("int",), 16),
        "hidden_units": Field(("[int]",), [400, 400, 400]),
        "cross_layers": Field(("int",), 3),
    },
    "data": {
        "format": Field(("str",), "parquet"),
        "train": Field(("str", "[str]")),
        "test": Field(("str", "[str]")),
        "dir": Field(("str",)),
        "train_days": Field(("str", "[str]")),
        "test_days": Field(("str", "[str]")),
        "pattern": Field(("str",)),
        "label": Field(("str",), "label"),
        "delimiter": Field(("str",), ","),
        "header": Field(("bool",), True),
        "shuffle": Field(("bool",), True),
        "prefetch": Field(("int",), 2),
        "on_bad_row": Field(("str",), "raise"),
    },
    "optimizer": {
        "sparse": Field(("table",), {"type": "adagrad", "learning_rate": 0.05}),
        "dense": Field(("table",), {"type": "adam", "learning_rate": 0.001}),
    },
    "train": {
        "epochs": Field(("int",), 1),
        "batch_size": Field(("int",), 4096),
        "steps_per_epoch": Field(("int",)),
        "log_every": Field(("int",), 100),
    },
    "checkpoint": {
        "dir": Field(("str",)),
        "save_every_n_steps": Field(("int",)),
        "keep": Field(("int",)),
    },
    "eviction": {
        "show_decay_rate": Field(("float",), 0.98),
        "show_threshold": Field(("float",)),
        "max_unseen_days": Field(("int",)),
        "combine": Field(("str",), "any"),
    },
    "distributed": {
        "timeout_s": Field(("float",), 300.0),
    },
}

COLUMN_KEYS = {
    "category": ("type", "key", "dtype", "embedding_share"),
    "numeric": ("type", "key", "default", "transforms"),
    "bucketized": ("type", "key", "default", "transforms", "boundaries"),
}


def _all_paths(schema: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in schema.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out.extend(_all_paths(v, f"{prefix}{k}."))
    return out


def _unknown(where: str, path: str, valid: Sequence[str]) -> ConfigError:
    """The error for an unknown key, suggesting the closest valid one (siblings first)."""
    name = path.rsplit(".", 1)[-1]
    prefix = path[: len(path) - len(name)]
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    if close:
        hint = f'; did you mean "{prefix}{close[0]}"?'
    else:
        everywhere = _all_paths(SCHEMA)
        by_leaf = {p.rsplit(".", 1)[-1]: p for p in everywhere}
        leaf = difflib.get_close_matches(name, list(by_leaf), n=1, cutoff=0.8)
        hint = f'; did you mean "{by_leaf[leaf[0]]}"?' if leaf else ""
    return ConfigError(
        f'{where}: unknown key "{path}"{hint or "."} Valid keys here: {", ".join(sorted(valid))}.'
    )


def _kind_ok(kind: str, v: Any) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    if kind == "table":
        return isinstance(v, dict)
    if kind.startswith("["):
        inner = kind[1:-1]
        return isinstance(v, list) and all(_kind_ok(inner, x) for x in v)
    raise RuntimeError(f"internal error: unknown config kind {kind!r}")


def _check_kind(where: str, path: str, field: Field, v: Any) -> Any:
    if v is None and field.default is None:  # an optional key left unset (config.json)
        return v
    if any(_kind_ok(k, v) for k in field.kinds):
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f'{where}: "{path}" must be a finite number. Received: {v!r}.')
        return v
    want = " or ".join(k.replace("[", "list of ").replace("]", "s") for k in field.kinds)
    raise ConfigError(f'{where}: "{path}" must be {want}. Received: {v!r} ({type(v).__name__}).')


def _validate(where: str, doc: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = prefix + key
        if key not in schema:
            raise _unknown(where, path, list(schema))
        spec = schema[key]
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise ConfigError(
                    f'{where}: "{path}" must be a table ([{path}]). Received: {value!r}.'
                )
            out[key] = _validate(where, value, spec, path + ".")
        else:
            out[key] = _check_kind(where, path, spec, value)
    for key, spec in schema.items():
        if key not in out:
            out[key] = (
                _validate(where, {}, spec, prefix + key + ".")
                if isinstance(spec, dict)
                else (json.loads(json.dumps(spec.default)))
            )
    return out


@dataclass
class RunConfig:
    """A validated run configuration (paths absolute); see the module doc for the keys."""

    source: str
    seed: int
    output_dir: str
    columns: str | list[dict[str, Any]]
    model: dict[str, Any]
    data: dict[str, Any]
    optimizer: dict[str, Any]
    train: dict[str, Any]
    checkpoint: dict[str, Any]
    eviction: dict[str, Any]
    distributed: dict[str, Any]

    @property
    def has_test(self) -> bool:
        """Whether the config names test data."""
        return bool(self.data["test"] or self.data["test_days"])

    @property
    def model_dir(self) -> str:
        """The checkpoint root: ``checkpoint.dir``, else ``<output_dir>/model``."""
        return self.checkpoint["dir"] or os.path.join(self.output_dir, "model")

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a JSON-ready dict (what ``config.json`` holds)."""
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


def _abs(base: str, p: str) -> str:
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(base, p))


def _check_values(where: str, c: RunConfig) -> None:
    def positive(path: str, v: int | None, minimum: int = 1) -> None:
        if v is not None and v < minimum:
            raise ConfigError(f'{where}: "{path}" must be >= {minimum}. Received: {v}.')

    if c.model["name"].lower() not in MODEL_NAMES:
        close = difflib.get_close_matches(c.model["name"].lower(), MODEL_NAMES, n=1)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        raise ConfigError(
            f'{where}: "model.name" must be one of {MODEL_NAMES}. '
            f"Received: {c.model['name']!r}{hint}"
        )
    c.model["name"] = c.model["name"].lower()
    if c.data["format"] not in FORMATS:
        raise ConfigError(
            f'{where}: "data.format" must be one of {FORMATS}. Received: {c.data["format"]!r}.'
        )
    positive("model.embedding_dim", c.model["embedding_dim"])
    positive("model.cross_layers", c.model["cross_layers"], 0)
    for i, u in enumerate(c.model["hidden_units"]):
        positive(f"model.hidden_units[{i}]", u)
    positive("seed", c.seed, 0)
    positive("train.epochs", c.train["epochs"])
    positive("train.batch_size", c.train["batch_size"])
    positive("train.steps_per_epoch", c.train["steps_per_epoch"])
    positive("train.log_every", c.train["log_every"])
    positive("data.prefetch", c.data["prefetch"], 0)
    positive("checkpoint.save_every_n_steps", c.checkpoint["save_every_n_steps"])
    positive("checkpoint.keep", c.checkpoint["keep"])
    if c.distributed["timeout_s"] <= 0:
        raise ConfigError(
            f'{where}: "distributed.timeout_s" must be > 0. '
            f"Received: {c.distributed['timeout_s']!r}."
        )
    if c.data["on_bad_row"] not in BAD_ROW_MODES:
        raise ConfigError(
            f'{where}: "data.on_bad_row" must be one of {BAD_ROW_MODES}. '
            f"Received: {c.data['on_bad_row']!r}."
        )
    if len(c.data["delimiter"]) != 1:
        raise ConfigError(
            f'{where}: "data.delimiter" must be one character. Received: {c.data["delimiter"]!r}.'
        )
    days = c.data["train_days"] or []
    repeated = sorted({d for d in days if days.count(d) > 1})
    if repeated:
        raise ConfigError(f'{where}: "data.train_days" repeats day(s) {repeated}; list each once.')
    if not (c.data["train"] or (c.data["dir"] and c.data["train_days"])):
        raise ConfigError(
            f'{where}: no training data: set "data.train" (files/globs) or "data.dir" and '
            '"data.train_days".'
        )
    if isinstance(c.columns, str) and c.columns != "criteo":
        raise ConfigError(
            f'{where}: "columns" must be "criteo" or a list of [[columns]] tables. '
            f"Received: {c.columns!r}."
        )
    for name in ("sparse", "dense"):
        make_optimizer(c, name)  # validates
    make_columns(c)  # validates
    make_policy(c)  # validates


def load_config(path: str | os.PathLike[str], output_dir: str | None = None) -> RunConfig:
    """Read and validate a run config (TOML, or the ``config.json`` that ``train`` writes).

    Args:
        path: the file.
        output_dir: replaces ``output_dir`` (relative to the current directory).

    Raises:
        ConfigError: the file is missing or not TOML, a key is unknown (the error
            names the closest valid key), a value has the wrong type or range.
    """
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the run config {where}: {e.strerror}") from None
    try:
        doc = json.loads(raw) if where.endswith(".json") else tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: not valid TOML/JSON: {e}") from None
    return config_from_dict(doc, where, output_dir=output_dir)


def config_from_dict(doc: dict[str, Any], where: str, output_dir: str | None = None) -> RunConfig:
    """Validate a config document (parsed TOML, or ``RunConfig.to_dict()`` output).

    Args:
        doc: the document.
        where: its file, named by errors; relative paths are relative to its directory.
        output_dir: replaces ``output_dir`` (relative to the current directory).

    Raises:
        ConfigError: as :func:`load_config`.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a run config must be a table. Received: {type(doc).__name__}.")
    v = _validate(where, doc, SCHEMA)
    base = os.path.dirname(os.path.abspath(where))
    d = v["data"]
    for key in ("train", "test"):
        if isinstance(d[key], str):
            d[key] = [d[key]]
        if d[key]:
            d[key] = [_abs(base, p) for p in d[key]]
    for key in ("train_days", "test_days"):
        if isinstance(d[key], str):
            d[key] = [d[key]]
    if d["dir"]:
        d["dir"] = _abs(base, d["dir"])
    if v["checkpoint"]["dir"]:
        v["checkpoint"]["dir"] = _abs(base, v["checkpoint"]["dir"])
    out = os.path.abspath(output_dir) if output_dir else _abs(base, v["output_dir"])
    cfg = RunConfig(
        where,
        v["seed"],
        out,
        v["columns"],
        v["model"],
        d,
        v["optimizer"],
        v["train"],
        v["checkpoint"],
        v["eviction"],
        v["distributed"],
    )
    _check_values(where, cfg)
    return cfg


def make_policy(cfg: RunConfig) -> EvictionPolicy:
    """Return the tables' decay and eviction policy of ``[eviction]``.

    Raises:
        ConfigError: a value out of range (the message names ``eviction``).
    """
    e = cfg.eviction
    try:
        return EvictionPolicy(
            show_decay_rate=float(e["show_decay_rate"]),
            show_threshold=None if e["show_threshold"] is None else float(e["show_threshold"]),
            max_unseen_days=e["max_unseen_days"],
            combine=e["combine"],
        )
    except ArgumentError as err:
        raise ConfigError(f"{cfg.source}: eviction: {err}") from None


def make_optimizer(cfg: RunConfig, which: str) -> SparseOptimizer:
    """Return ``optimizer.<which>`` (``sparse`` or ``dense``) as a tnrec optimizer config.

    Raises:
        ConfigError: unknown type or hyper-parameter (closest one named), bad value.
    """
    where, path = cfg.source, f"optimizer.{which}"
    doc = dict(cfg.optimizer[which])
    kind = str(doc.pop("type", "")).lower()
    types = (
        OPTIMIZERS if which == "sparse" else {k: v for k, v in OPTIMIZERS.items() if k != "ftrl"}
    )
    if kind not in types:
        raise ConfigError(
            f'{where}: "{path}.type" must be one of {sorted(types)}. Received: {kind!r}.'
        )
    cls = types[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k, val in doc.items():
        if k not in fields:
            raise _unknown(where, f"{path}.{k}", ["type", *fields])
        kinds = ("bool",) if fields[k].type in (bool, "bool") else ("float",)
        _check_kind(where, f"{path}.{k}", Field(kinds), val)
    try:
        return cls(**doc)
    except ArgumentError as e:
        raise ConfigError(f"{where}: {path}: {e}") from None


def make_columns(cfg: RunConfig) -> list[Column]:
    """Return the configured feature columns (``"criteo"``: :func:`tnrec.data.criteo_columns`).

    Raises:
        ConfigError: an unknown column type or key, or an invalid column.
    """
    if isinstance(cfg.columns, str):
        return list(criteo_columns())
    docs = []
    for i, col in enumerate(cfg.columns):
        path = f"columns[{i}]"
        kind = col.get("type")
        if kind not in COLUMN_KEYS:
            raise ConfigError(
                f'{cfg.source}: "{path}.type" must be one of {sorted(COLUMN_KEYS)}. '
                f"Received: {kind!r}."
            )
        for k in col:
            if k not in COLUMN_KEYS[kind]:
                raise _unknown(cfg.source, f"{path}.{k}", COLUMN_KEYS[kind])
        doc: dict[str, Any] = (
            {"dtype": "int", "embedding_share": None} if kind == "category" else {}
        )
        if kind != "category":
            doc.update(default=0.0, transforms=[])
        doc.update(col)
        doc["transforms"] = [
            {"type": t} if isinstance(t, str) else t for t in doc.get("transforms", [])
        ]
        if kind == "category":
            doc.pop("transforms")
        docs.append(doc)
    spec = {"format": SPEC_FORMAT, "version": SPEC_VERSION, "hash": HASH_NAME, "columns": docs}
    try:
        return from_spec(spec)
    except SpecError as e:
        raise ConfigError(f'{cfg.source}: "columns": {e}') from None


def _expand(patterns: Sequence[str], label: str, error: type[ArgumentError]) -> list[str]:
    files: list[str] = []
    for p in patterns:
        matches = sorted(m for m in glob.glob(p) if os.path.isfile(m))
        if not matches:
            raise error(f'{label}: pattern "{p}" matches no file.')
        files.extend(matches)
    return files


def _holds_rows(cfg: RunConfig, path: str) -> bool:
    """Whether ``path`` holds a row: Parquet metadata, or text beyond the CSV header line."""
    d = cfg.data
    if d["format"] == "parquet":
        try:
            with pq.ParquetFile(path) as f:
                return bool(f.metadata.num_rows > 0)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f'file "{path}": cannot be read as Parquet: {e}') from None
    try:
        size = os.path.getsize(path)
        if d["format"] == "csv" and d["header"] and size:
            with open(path, "rb") as f:
                return size > len(f.readline())
        return size > 0
    except OSError as e:
        raise DataError(f'file "{path}": cannot be read: {e.strerror}') from None


def _check_rows(
    cfg: RunConfig, files: Sequence[str], label: str, error: type[ArgumentError]
) -> None:
    if not any(_holds_rows(cfg, f) for f in files):
        shown = ", ".join(files[:3]) + (f", ... ({len(files)} files)" if len(files) > 3 else "")
        raise error(f"{label}: the input holds no rows (files: {shown}).")


def day_files(cfg: RunConfig, which: str, days: Sequence[str]) -> list[str]:
    """Return the files of ``days`` under ``data.dir`` (``data.pattern`` in each day's directory).

    Raises:
        ConfigError: a day matches no file (the error names the key and the day).
    """
    d = cfg.data
    pattern = d["pattern"] or DEFAULT_PATTERN[d["format"]]
    try:
        return list_files(d["dir"], list(days), pattern)
    except DataError as e:
        raise ConfigError(f'{cfg.source}: "data.{which}_days": {e}') from None


def input_files(
    cfg: RunConfig,
    which: str,
    *,
    paths: Sequence[str] | None = None,
    days: Sequence[str] | None = None,
) -> list[str]:
    """Return the checked files of the ``train`` or ``test`` data (or of ``paths``, or ``days``).

    Args:
        cfg: the run config.
        which: ``"train"`` or ``"test"``.
        paths: files/globs given on the command line (``--data``) instead of the config's.
        days: days under ``data.dir`` instead of the config's.

    Raises:
        ConfigError: no such data in the config, a pattern or day matches no
            file, or the files hold no rows (the error names the key and the
            pattern or day).
        ArgumentError: the same for ``paths`` (named ``--data``).
        DataError: a Parquet file cannot be read (named).
    """
    d = cfg.data
    error: type[ArgumentError] = ConfigError
    if paths:
        label, error = "--data " + " ".join(paths), ArgumentError
        files = _expand([os.path.abspath(p) for p in paths], "--data", error)
    elif days or (not d[which] and d["dir"] and d[f"{which}_days"]):
        days = list(days or d[f"{which}_days"])
        label = f'{cfg.source}: "data.{which}_days" {", ".join(days)}'
        files = day_files(cfg, which, days)
    elif d[which]:
        label = f'{cfg.source}: "data.{which}"'
        files = _expand(d[which], label, error)
    else:
        raise ConfigError(
            f'{cfg.source}: no {which} data: set "data.{which}" or "data.dir" and '
            f'"data.{which}_days" (or pass --data).'
        )
    _check_rows(cfg, files, label, error)
    return files


def check_inputs(cfg: RunConfig) -> None:
    """Check every input of the config now: each training day (or the train globs), the test data.

    Raises:
        ConfigError: as :func:`input_files`.
        DataError: as :func:`input_files`.
    """
    if cfg.data["train"]:
        input_files(cfg, "train")
    else:
        for dt in cfg.data["train_days"]:
            input_files(cfg, "train", days=[dt])
    if cfg.has_test:
        input_files(cfg, "test")


def make_reader(
    cfg: RunConfig,
    which: str,
    *,
    paths: Sequence[str] | None = None,
    days: Sequence[str] | None = None,
    shuffle: bool = False,
) -> Reader:
    """Return the reader of the ``train`` or ``test`` data (or of ``paths``, or of ``days``).

    The files are checked by :func:`input_files`; the reader takes
    ``data.on_bad_row``.

    Raises:
        ConfigError: as :func:`input_files`.
        ArgumentError: as :func:`input_files`.
        DataError: as :func:`input_files`.
    """
    d = cfg.data
    files = input_files(cfg, which, paths=paths, days=days)
    cols = make_columns(cfg)
    common: dict[str, Any] = dict(
        batch_size=cfg.train["batch_size"],
        shuffle=shuffle,
        seed=cfg.seed,
        prefetch=d["prefetch"],
        label=d["label"],
        on_bad_row=d["on_bad_row"],
    )
    if d["format"] == "parquet":
        return read_parquet(files, cols, **common)
    if d["format"] == "csv":
        return read_csv(files, cols, delimiter=d["delimiter"], header=d["header"], **common)
    return read_criteo(files, cols, **common)


def _leaf_keys(schema: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in schema.items():
        out.extend(_leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k])
    return out


def _digest(value: Any) -> int:
    text = json.dumps(value, sort_keys=True, allow_nan=False)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big")


def key_digests(cfg: RunConfig) -> list[tuple[str, int]]:
    """Return ``(key, digest)`` of every config key and of ``model_dir``, in a fixed order.

    A digest is the first 6 bytes of the sha256 of the resolved value's JSON:
    an int below 2**48, exact in a float64, so workers can compare their
    configs in one all-reduce and name the keys that differ.
    """
    doc = cfg.to_dict()
    out = []
    for key in _leaf_keys(SCHEMA):
        value: Any = doc
        for part in key.split("."):
            value = value[part]
        out.append((key, _digest(value)))
    out.append(("model_dir", _digest(cfg.model_dir)))
    return out
