"""The run configuration of ``tnrec train``: a TOML file, validated key by key.

Every key, with its default::

    seed = 0                       # torch init, reader shuffle
    output_dir = "runs/tnrec"      # relative paths are relative to the config file
    columns = "criteo"             # or [[columns]] tables, the feature-spec fields:
    # [[columns]]
    # type = "category"            # category | numeric | bucketized
    # key = "user_id"
    # dtype = "int"                # category: int | str | sign (64-bit signs, unhashed)
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
    format = "parquet"             # parquet | csv | criteo | tfrecord
    train = ["data/2024-05-*/*.parquet"]   # files/globs; or dir + train_days (+ pattern)
    test = "data/test/*.parquet"           # or dir + test_days; optional
    dir = "data"
    train_days = ["2024-05-10"]
    test_days = ["2024-05-11"]
    pattern = "*.parquet"          # default by format: *.parquet, *.csv, *, *.tfrecord*
    label = "label"
    delimiter = ","                # csv
    header = true                  # csv
    compression = "auto"           # tfrecord: auto (by name: *.gz, *.zlib) | none | gzip | zlib
    shuffle = true                 # training data, deterministic given seed
    prefetch = 2                   # optional; left out: 2 if torch leaves a core, else 0 (inline)
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
    pipeline = true                # optional: read and prepare the next batch while a step
                                   # computes; omitted: where it pays (fit(pipeline=None))
    balance = false                # true: hand out row groups and files as workers run dry
    device = "cpu"                 # cpu | cuda | cuda:N: the dense part's (tables stay on the host)

    [checkpoint]                   # the model dir is a checkpoint root (tnrec.checkpoint)
    dir = "runs/tnrec/model"       # default: <output_dir>/model
    save_every_n_steps = 1000      # optional: mid-day checkpoints (resume inside a day)
    keep = 5                       # optional: keep this many newest generations
    save_every_days = 1            # save every N-th day of data.train_days and the last one

    [schedule]                     # optional: both optimizers' learning rate, per step
    type = "warmup"                # warmup | exponentialdecay | stepdecay | cosinedecay
    steps = 1000                   # the type's arguments (tnrec.schedules); warmup's then:
    start_factor = 0.1
    then = {type = "cosinedecay", decay_steps = 100000, min_factor = 0.05}

    [eviction]                     # every table's decay and eviction (tnrec.table.EvictionPolicy)
    show_decay_rate = 0.98         # show/click factor per day, before each day's save
    show_threshold = 1.0           # optional: evict rows whose decayed show is below this
    max_unseen_days = 30           # optional: evict rows not pushed for more days than this
    combine = "any"                # any | all
    max_rows = 100000000           # optional: row cap of every table, kept per bucket (>= 1024)
    low_water = 0.95               # a bucket over its share of max_rows is evicted down to this

    [admission]                    # when a key gets a row (tnrec.table.AdmissionPolicy); optional
    min_show = 2.0                 # at the first pull after its accumulated show reaches this
    probability = 0.5              # optional: a fixed share of the key space (pure function of key)
    sketch_bytes = 16777216        # count-min sketch per table (split over the 1024 buckets)
    read_unadmitted = "zeros"      # zeros | init: what a pull returns for a key without a row

    [distributed]                  # under torchrun (tnrec.distribute.PsStrategy)
    timeout_s = 300.0              # a collective not done within this fails, naming rank and phase
    memory_limit_bytes = 8000000000  # optional: the most bytes one worker's tables may hold
    mode = "sync"                  # sync | async (docs/async.md): async steps never wait for
    staleness = 4                  # another worker; async: most own steps with pushes in flight

Integers are checked against their range (``seed`` >= 0; ``embedding_dim``,
``hidden_units``, ``epochs``, ``batch_size``, ``log_every``,
``save_every_n_steps``, ``keep``, ``save_every_days`` >= 1; ``cross_layers``,
``prefetch`` >= 0);
every float, here and in ``[optimizer.*]``, must be finite (TOML's ``nan``
and ``inf`` are refused).

``data.train_days`` are trained in order, one checkpoint per day; with
``data.train`` globs the whole input is one day labelled ``"train"``. An
unknown key is an error that names the closest valid key. Every input (each
training day, the test data) must match files that hold at least one row;
:func:`tnrec.cli.inputs.check_inputs` checks them all before training starts.

:func:`load_config` returns a :class:`RunConfig`: each table above is a
dataclass (:class:`ModelConfig`, :class:`DataConfig`, ...) whose fields are
its keys, with these defaults (``cfg.model.name``, ``cfg.data.train_days``);
``[optimizer.sparse]`` and ``[optimizer.dense]`` stay tables (dicts),
checked by :func:`make_optimizer`. The keys, their types and defaults are
read from the dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from tnrec import _fileio
from tnrec.data import criteo_columns
from tnrec.errors import ArgumentError, ConfigError, SpecError
from tnrec.feature_column import HASH_NAME, SPEC_FORMAT, SPEC_VERSION, Column, from_spec
from tnrec.layers.device import parse_device
from tnrec.models import MODELS
from tnrec.optimizer import SparseOptimizer
from tnrec.schedules import Schedule, schedule_from_config
from tnrec.table import OPTIMIZERS, AdmissionPolicy, EvictionPolicy

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "AdmissionConfig",
    "EvictionConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RunConfig",
    "TrainConfig",
    "config_from_dict",
    "key_digests",
    "load_config",
    "make_columns",
    "make_optimizer",
    "make_admission",
    "make_policy",
    "make_schedule",
]

MODEL_NAMES = tuple(MODELS)
FORMATS = ("parquet", "csv", "criteo", "tfrecord")
COMPRESSIONS = ("auto", "none", "gzip", "zlib")
BAD_ROW_MODES = ("raise", "skip")

_ONE_OR_LIST = "one item or a list"
# A list of str, where the file may give one str (read as a one-item list).
StrList = Annotated[list[str], _ONE_OR_LIST]


# --------------------------------------------------------------------------- the sections


@dataclass
class ModelConfig:
    """``[model]``: the zoo model and its sizes (see :class:`RunConfig` for an example)."""

    name: str = "deepfm"
    embedding_dim: int = 16
    hidden_units: list[int] = field(default_factory=lambda: [400, 400, 400])
    cross_layers: int = 3


@dataclass
class DataConfig:
    """``[data]``: the inputs (paths absolute; a single path or day read as a one-item list)."""

    format: str = "parquet"
    train: StrList | None = None
    test: StrList | None = None
    dir: str | None = None
    train_days: StrList | None = None
    test_days: StrList | None = None
    pattern: str | None = None
    label: str = "label"
    delimiter: str = ","
    header: bool = True
    compression: str = "auto"
    shuffle: bool = True
    prefetch: int | None = None
    on_bad_row: str = "raise"


@dataclass
class OptimizerConfig:
    """``[optimizer]``: two free-form tables, ``type`` and hyper-parameters (checked later)."""

    sparse: dict[str, Any] = field(
        default_factory=lambda: {"type": "adagrad", "learning_rate": 0.05}
    )
    dense: dict[str, Any] = field(default_factory=lambda: {"type": "adam", "learning_rate": 0.001})


@dataclass
class TrainConfig:
    """``[train]``: passes, batch size, logging, the input pipeline (``Model.fit(pipeline=)``)."""

    epochs: int = 1
    batch_size: int = 4096
    steps_per_epoch: int | None = None
    log_every: int = 100
    pipeline: bool | None = None
    balance: bool = False
    device: str = "cpu"


@dataclass
class CheckpointConfig:
    """``[checkpoint]``: the model dir (absolute; default ``<output_dir>/model``), saves, keep."""

    dir: str | None = None
    save_every_n_steps: int | None = None
    keep: int | None = None
    save_every_days: int = 1


@dataclass
class EvictionConfig:
    """``[eviction]``: every table's decay and eviction (:func:`make_policy`)."""

    show_decay_rate: float = 0.98
    show_threshold: float | None = None
    max_unseen_days: int | None = None
    combine: str = "any"
    max_rows: int | None = None
    low_water: float = 0.95


@dataclass
class AdmissionConfig:
    """``[admission]``: when a key gets a row (:func:`make_admission`); off unless
    ``min_show`` or ``probability`` is set."""

    min_show: float | None = None
    probability: float | None = None
    sketch_bytes: int = 16 << 20
    read_unadmitted: str = "zeros"


@dataclass
class DistributedConfig:
    """``[distributed]``: the collective timeout, the worker's memory limit, sync or async mode."""

    timeout_s: float = 300.0
    memory_limit_bytes: int | None = None
    mode: str = "sync"
    staleness: int = 4


@dataclass
class RunConfig:
    """A validated run configuration (paths absolute); see the module doc for the keys.

    ``source`` is the file it was read from (named by errors); every other
    field is a key of the file. Build one with :func:`load_config` or
    :func:`config_from_dict`, which check every value.

    Example:
        >>> cfg = config_from_dict({"data": {"train": "day1/*.parquet"}}, "/runs/run.toml")
        >>> cfg.model.name, cfg.train.batch_size, cfg.data.train
        ('deepfm', 4096, ['/runs/day1/*.parquet'])
        >>> cfg.model_dir, cfg.to_dict()["optimizer"]["sparse"]["type"]
        ('/runs/runs/tnrec/model', 'adagrad')
    """

    source: str  # not a key: the file
    seed: int = 0
    output_dir: str = "runs/tnrec"
    columns: str | list[dict[str, Any]] = "criteo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    schedule: dict[str, Any] | None = None  # checked by make_schedule
    eviction: EvictionConfig = field(default_factory=EvictionConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @property
    def has_test(self) -> bool:
        """Whether the config names test data."""
        return bool(self.data.test or self.data.test_days)

    @property
    def model_dir(self) -> str:
        """The checkpoint root: ``checkpoint.dir``, else ``<output_dir>/model``."""
        return self.checkpoint.dir or os.path.join(self.output_dir, "model")

    def to_dict(self) -> dict[str, Any]:
        """Return the config as a JSON-ready dict (what ``config.json`` holds)."""
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


# --------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Field:
    """One config key: the accepted kinds (``int``, ``str``, ``[int]``, ``table``...), default."""

    kinds: tuple[str, ...]
    default: Any = None


_SCALAR_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _kinds(hint: Any) -> tuple[str, ...]:
    """The kinds of a type hint: ``int | None``: ``("int",)``; ``StrList``: ``("str", "[str]")``."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        return tuple(k for a in args if a is not NoneType for k in _kinds(a))
    if origin is Annotated:
        kinds = _kinds(args[0])
        return (kinds[0][1:-1], *kinds) if _ONE_OR_LIST in args[1:] else kinds
    if origin is list:
        return (f"[{_kinds(args[0])[0]}]",)
    if origin is dict:
        return ("table",)
    if hint in _SCALAR_KINDS:
        return (_SCALAR_KINDS[hint],)
    raise RuntimeError(f"internal error: no config kind for the type {hint!r}")


@functools.cache
def _schema(cls: type) -> dict[str, Field | type]:
    """``{key: Field}`` of a config dataclass, or ``{key: dataclass}`` for a section."""
    hints = get_type_hints(cls, include_extras=True)
    out: dict[str, Field | type] = {}
    for f in dataclasses.fields(cls):
        if cls is RunConfig and f.name == "source":  # the file, not a key
            continue
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out[f.name] = hint
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = Field(_kinds(hint), default)
    return out


def _paths(cls: type, prefix: str = "", leaves: bool = False) -> list[str]:
    """Every key of ``cls`` as a dotted path, depth first (``leaves``: not the sections)."""
    out = []
    for k, v in _schema(cls).items():
        if isinstance(v, Field) or not leaves:
            out.append(prefix + k)
        if not isinstance(v, Field):
            out.extend(_paths(v, f"{prefix}{k}.", leaves))
    return out


def _unknown(where: str, path: str, valid: Sequence[str]) -> ConfigError:
    """The error for an unknown key, suggesting the closest valid one (siblings first)."""
    name = path.rsplit(".", 1)[-1]
    prefix = path[: len(path) - len(name)]
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    if close:
        hint = f'; did you mean "{prefix}{close[0]}"?'
    else:
        everywhere = _paths(RunConfig)
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


def _check_kind(where: str, path: str, spec: Field, v: Any) -> Any:
    if v is None and spec.default is None:  # an optional key left unset (config.json)
        return v
    kind = next((k for k in spec.kinds if _kind_ok(k, v)), None)
    if kind is not None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f'{where}: "{path}" must be a finite number. Received: {v!r}.')
        return [v] if f"[{kind}]" in spec.kinds else v  # one item of a list: a one-item list
    want = " or ".join(k.replace("[", "list of ").replace("]", "s") for k in spec.kinds)
    raise ConfigError(f'{where}: "{path}" must be {want}. Received: {v!r} ({type(v).__name__}).')


def _validate(where: str, doc: dict[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """The checked values of ``doc``, keyed as ``cls``'s fields; each section built as its class.

    A key ``doc`` leaves out takes the dataclass default.
    """
    schema = _schema(cls)
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = prefix + key
        if key not in schema:
            raise _unknown(where, path, list(schema))
        spec = schema[key]
        if isinstance(spec, Field):
            out[key] = _check_kind(where, path, spec, value)
        elif not isinstance(value, dict):
            raise ConfigError(f'{where}: "{path}" must be a table ([{path}]). Received: {value!r}.')
        else:
            out[key] = spec(**_validate(where, value, spec, path + "."))
    return out


# --------------------------------------------------------------------------- loading


def _abs(base: str, p: str) -> str:
    if _fileio.is_remote(p) or p.startswith("file://") or os.path.isabs(p):
        return p
    if _fileio.is_remote(base):
        return _fileio.join(base, p)
    return os.path.normpath(os.path.join(base, p))


def _check_device_form(where: str, device: str) -> None:
    """Refuse a ``train.device`` of another form than ``cpu | cuda | cuda:N``.

    Only the form: whether this machine has the device is checked by
    :func:`tnrec.cli.train.train_device`, so a config written on a GPU machine
    still reads (``evaluate``, ``inspect``) on a CPU one.
    """
    try:
        parse_device(device)
    except ArgumentError as e:
        raise ConfigError(f'{where}: "train.device": {e}') from None


def _check_values(where: str, c: RunConfig) -> None:
    def positive(path: str, v: int | None, minimum: int = 1) -> None:
        if v is not None and v < minimum:
            raise ConfigError(f'{where}: "{path}" must be >= {minimum}. Received: {v}.')

    m, d = c.model, c.data
    if m.name.lower() not in MODEL_NAMES:
        close = difflib.get_close_matches(m.name.lower(), MODEL_NAMES, n=1)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        raise ConfigError(
            f'{where}: "model.name" must be one of {MODEL_NAMES}. Received: {m.name!r}{hint}'
        )
    m.name = m.name.lower()
    if d.format not in FORMATS:
        raise ConfigError(
            f'{where}: "data.format" must be one of {FORMATS}. Received: {d.format!r}.'
        )
    positive("model.embedding_dim", m.embedding_dim)
    positive("model.cross_layers", m.cross_layers, 0)
    for i, u in enumerate(m.hidden_units):
        positive(f"model.hidden_units[{i}]", u)
    positive("seed", c.seed, 0)
    positive("train.epochs", c.train.epochs)
    positive("train.batch_size", c.train.batch_size)
    positive("train.steps_per_epoch", c.train.steps_per_epoch)
    positive("train.log_every", c.train.log_every)
    positive("data.prefetch", d.prefetch, 0)
    positive("checkpoint.save_every_n_steps", c.checkpoint.save_every_n_steps)
    positive("checkpoint.keep", c.checkpoint.keep)
    positive("checkpoint.save_every_days", c.checkpoint.save_every_days)
    if c.distributed.mode not in ("sync", "async"):
        raise ConfigError(
            f'{where}: "distributed.mode" must be "sync" or "async". '
            f"Received: {c.distributed.mode!r}."
        )
    if c.distributed.staleness < 0:
        raise ConfigError(
            f'{where}: "distributed.staleness" must be >= 0. Received: {c.distributed.staleness!r}.'
        )
    if c.distributed.timeout_s <= 0:
        raise ConfigError(
            f'{where}: "distributed.timeout_s" must be > 0. Received: {c.distributed.timeout_s!r}.'
        )
    if d.on_bad_row not in BAD_ROW_MODES:
        raise ConfigError(
            f'{where}: "data.on_bad_row" must be one of {BAD_ROW_MODES}. '
            f"Received: {d.on_bad_row!r}."
        )
    _check_device_form(where, c.train.device)
    if len(d.delimiter) != 1:
        raise ConfigError(
            f'{where}: "data.delimiter" must be one character. Received: {d.delimiter!r}.'
        )
    days = d.train_days or []
    repeated = sorted({dt for dt in days if days.count(dt) > 1})
    if repeated:
        raise ConfigError(f'{where}: "data.train_days" repeats day(s) {repeated}; list each once.')
    if not (d.train or (d.dir and d.train_days)):
        raise ConfigError(
            f'{where}: no training data: set "data.train" (files/globs) or "data.dir" and '
            '"data.train_days".'
        )
    if d.compression.lower() not in COMPRESSIONS:
        raise ConfigError(
            f'{where}: "data.compression" must be one of {COMPRESSIONS}. '
            f"Received: {d.compression!r}."
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
    make_admission(c)  # validates
    make_schedule(c)  # validates
    positive("distributed.memory_limit_bytes", c.distributed.memory_limit_bytes)


def load_config(path: str | os.PathLike[str], output_dir: str | None = None) -> RunConfig:
    """Read and validate a run config (TOML, or the ``config.json`` that ``train`` writes).

    Args:
        path: the file: a local path, or a URI (``s3://bucket/jobs/ctr.toml``).
            Relative paths in it are relative to its directory, a URI's too,
            so a config read from a URI names ``output_dir`` as an absolute
            local path (or ``output_dir`` is given here).
        output_dir: replaces ``output_dir`` (relative to the current directory).

    Raises:
        ConfigError: the file is missing or not TOML, a key is unknown (the error
            names the closest valid key), a value has the wrong type or range.
    """
    where = os.fspath(path)
    try:
        raw = _fileio.read_bytes(where)
    except OSError as e:
        raise ConfigError(f"cannot read the run config {where}: {e.strerror or e}") from None
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
    cfg = RunConfig(where, **_validate(where, doc, RunConfig))
    base = (
        _fileio.parent(where)
        if _fileio.is_remote(where)
        else os.path.dirname(os.path.abspath(where))
    )
    d = cfg.data
    if d.train:
        d.train = [_abs(base, p) for p in d.train]
    if d.test:
        d.test = [_abs(base, p) for p in d.test]
    if d.dir:
        d.dir = _abs(base, d.dir)
    if cfg.checkpoint.dir:
        cfg.checkpoint.dir = _abs(base, cfg.checkpoint.dir)
    cfg.output_dir = _fileio.absolute(output_dir) if output_dir else _abs(base, cfg.output_dir)
    _check_values(where, cfg)
    return cfg


# --------------------------------------------------------------------------- what a config builds


def make_policy(cfg: RunConfig) -> EvictionPolicy:
    """Return the tables' decay and eviction policy of ``[eviction]``.

    Raises:
        ConfigError: a value out of range (the message names ``eviction``).
    """
    e = cfg.eviction
    try:
        return EvictionPolicy(
            show_decay_rate=float(e.show_decay_rate),
            show_threshold=None if e.show_threshold is None else float(e.show_threshold),
            max_unseen_days=e.max_unseen_days,
            combine=e.combine,
            max_rows=e.max_rows,
            low_water=float(e.low_water),
        )
    except ArgumentError as err:
        raise ConfigError(f"{cfg.source}: eviction: {err}") from None


def make_schedule(cfg: RunConfig) -> Schedule | None:
    """Return the learning-rate schedule of ``[schedule]`` (None when the config has none).

    Raises:
        ConfigError: an unknown type or argument, or a bad value (the message names
            ``schedule``).
    """
    if cfg.schedule is None:
        return None
    try:
        return schedule_from_config(cfg.schedule, "schedule")
    except ArgumentError as err:
        raise ConfigError(f"{cfg.source}: {err}") from None


def make_admission(cfg: RunConfig) -> AdmissionPolicy | None:
    """Return the tables' admission policy of ``[admission]`` (None when it sets neither
    ``min_show`` nor ``probability``).

    Raises:
        ConfigError: a value out of range (the message names ``admission``).
    """
    a = cfg.admission
    if a.min_show is None and a.probability is None:
        return None
    try:
        return AdmissionPolicy(
            min_show=None if a.min_show is None else float(a.min_show),
            probability=None if a.probability is None else float(a.probability),
            sketch_bytes=a.sketch_bytes,
            read_unadmitted=a.read_unadmitted,
        )
    except ArgumentError as err:
        raise ConfigError(f"{cfg.source}: admission: {err}") from None


def make_optimizer(cfg: RunConfig, which: str) -> SparseOptimizer:
    """Return ``optimizer.<which>`` (``sparse`` or ``dense``) as a tnrec optimizer config.

    Raises:
        ConfigError: unknown type or hyper-parameter (closest one named), bad value.
    """
    where, path = cfg.source, f"optimizer.{which}"
    doc = dict(cfg.optimizer.sparse if which == "sparse" else cfg.optimizer.dense)
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


COLUMN_KEYS = {
    "category": ("type", "key", "dtype", "embedding_share"),
    "numeric": ("type", "key", "default", "transforms"),
    "bucketized": ("type", "key", "default", "transforms", "boundaries"),
}


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
    spec = {
        "format": SPEC_FORMAT,
        "format_version": SPEC_VERSION,
        "hash": HASH_NAME,
        "columns": docs,
    }
    try:
        return from_spec(spec)
    except SpecError as e:
        raise ConfigError(f'{cfg.source}: "columns": {e}') from None


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
    for key in _paths(RunConfig, leaves=True):
        value: Any = doc
        for part in key.split("."):
            value = value[part]
        out.append((key, _digest(value)))
    out.append(("model_dir", _digest(cfg.model_dir)))
    return out
