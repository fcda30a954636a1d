"""Synthetic Criteo-schema click data drawn from a known hidden model.

The generator writes day-partitioned Parquet with the columns of the Criteo
display-advertising data set, plus the true click probability of every row, so a
trained model can be compared with the best achievable AUC ("optimal AUC").

Layout written by :func:`generate`::

    out_dir/
      2024-05-10/part-00000.parquet     # training day 0 (``parts_per_day`` files per day)
      2024-05-11/part-00000.parquet     # training day 1
      ...
      test/part-00000.parquet           # held-out test split: the day after the last
                                        # training day, drawn from the same hidden model
      _synthetic.json                   # config, bias, CTR per day, optimal AUC

Columns (in this order, see :data:`SCHEMA`):

* ``label``: int64, 0 or 1, drawn as ``Bernoulli(p_true)``;
* ``I1`` .. ``I13``: int64 counts >= 0, nullable;
* ``C1`` .. ``C26``: 8 lower-case hex characters (like Criteo's hashed values), nullable;
* ``p_true``: float64, the true click probability of the row;
* ``row_id``: int64, unique over all days and the test split
  (``day_index * rows_per_day + i``; the test split uses ``day_index = num_days``).

How a day is drawn (every number below is a field of :class:`SyntheticConfig`):

* Categorical column ``Cj`` has a base vocabulary of ``cardinalities[j-1]`` ids.
  Each value is an id of rank ``floor(X) - 1`` where ``X`` follows a power law
  ``x^-zipf_exponent`` on ``[1, K + 1)`` (a bounded Pareto draw, the continuous
  form of Zipf's law), so a few ids are very frequent and most are rare.
* **Id churn**: in columns whose cardinality is at least ``churn_min_cardinality``,
  a share ``new_id_share`` of the values of every day are ids that exist on that
  day only (one-off users, new creatives that do not return). They come from a
  pool of ``new_id_share * rows / 2`` ids per column and day, drawn uniformly, so
  each appears about twice. The first day has them too, so all days are drawn
  from the same distribution.
* Missing values: each value is missing with its column's rate
  (``categorical_missing_rates``, ``numeric_missing_rates``; the defaults are
  close to Criteo's).
* Numeric column ``Ij`` has a latent ``z ~ N(0, 1)``; the value written is
  ``floor(expm1(max(0, log_mean + log_std * z)))``, a heavy-tailed count with a
  point mass at 0.
* Hidden model: ``logit = bias + sum of per-id weights + sum of cross weights +
  sum_j numeric_effects[j] * x_j``. Missing values contribute 0.
  ``p_true = sigmoid(logit)``. The ``bias`` is solved once, by bisection on the
  first training day, so that the mean of ``p_true`` equals ``base_ctr``; every
  day and the test split use that same bias.

  * Numeric term: ``x_j = (log1p(value_j) - log_mean_j) / log_std_j`` of the
    value *written* (``numeric_effect_on_value=True``), so a model sees all of
    it; ``False`` uses the latent ``z_j``, which the floor and the clamp at 0
    partly hide.
  * Per-id weights (columns of ``id_weight_stds``): ``std_r * N(0, 1)``, the
    normal value computed by hashing ``(seed, column, id)``, so new ids get
    weights from the same law without storing a vocabulary. An id of rank ``r``
    (0 = most frequent) has ``std_r = std * min(1, (id_weight_tail_rank /
    (r + 1)) ** id_weight_tail_power)``: the frequent ids carry the column's
    spread and the rare ones (churned ids are numbered from the cardinality up)
    almost nothing, so the hidden model does not rest on ids seen too few
    times to be learned. With the defaults (rank 50, power 1.5) an id of rank 500 has 3% of
    the spread. ``id_weight_tail_rank=None`` gives every id ``std``.
  * Crosses (``(a, b, std)`` in ``crosses``): the value pair ``(u, v)`` of
    columns ``a`` and ``b`` adds ``std * <f_a(u), f_b(v)> / sqrt(cross_rank)``,
    where ``f_c(id)`` is ``cross_rank`` hashed ``N(0, 1)`` values per column and
    id (shared by the crosses of a column): a low-rank, factorization-machine
    interaction, the usual model of real feature crosses; its values still have
    spread ``std``. The default rank 1 makes each cross a product of one factor
    per value. ``cross_rank=None`` gives every value pair an independent
    ``N(0, std^2)`` weight instead. The default crosses join columns of 10 to
    24 ids.

  Why these defaults (generator version 2): the hidden model is learnable from
  its own data. At 1M training rows (``bench/synthetic_quality.py``) the
  optimal AUC is about 0.82; a Bayes oracle that estimates each id's and
  pair's weight from its training rows lands 0.002 below it, and the crosses
  are worth 0.05 AUC beyond their additive part, which is all LR can use.
  Version 1 gave every id of the Zipf tail and every value pair its own
  full-spread weight, and acted on the hidden ``z``: at 1M rows even that
  oracle stayed 0.04 below its optimum (0.83). ``SyntheticConfig(**V1_MODEL)``
  draws version 1's data again.

Everything is a pure function of ``seed`` and the config: each day, column and
purpose (values, missing mask, churn, labels) has its own random stream
(``SeedSequence(seed, spawn_key=(day, stream))``), and the Parquet files are
byte-identical for the same config, numpy and pyarrow versions.

Example:
    >>> import tempfile
    >>> from tnrec.data.synthetic import SyntheticConfig, generate
    >>> data = generate(tempfile.mkdtemp(), SyntheticConfig(rows_per_day=1_000, num_days=2))
    >>> data.days, data.test_day
    (('2024-05-10', '2024-05-11'), '2024-05-12')
    >>> data.ctr_by_day
    {'2024-05-10': 0.1, '2024-05-11': 0.108, 'test': 0.092}
    >>> round(data.optimal_auc, 3)   # the best AUC any model can reach on the test split
    0.842
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tnrec.errors import ArgumentError
from tnrec.metrics import exact_auc

__all__ = [
    "CATEGORICAL_COLUMNS",
    "CRITEO_CARDINALITIES",
    "GENERATOR_VERSION",
    "NUMERIC_COLUMNS",
    "SCHEMA",
    "GeneratedData",
    "SyntheticConfig",
    "V1_MODEL",
    "generate",
]

NUMERIC_COLUMNS: tuple[str, ...] = tuple(f"I{j}" for j in range(1, 14))
CATEGORICAL_COLUMNS: tuple[str, ...] = tuple(f"C{j}" for j in range(1, 27))

SCHEMA = pa.schema(
    [pa.field("label", pa.int64(), nullable=False)]
    + [pa.field(c, pa.int64()) for c in NUMERIC_COLUMNS]
    + [pa.field(c, pa.string()) for c in CATEGORICAL_COLUMNS]
    + [pa.field("p_true", pa.float64(), nullable=False)]
    + [pa.field("row_id", pa.int64(), nullable=False)]
)
"""The Arrow schema of every file :func:`generate` writes."""

# Distinct values per column in Criteo's Kaggle display-advertising data,
# clipped to [10, 10M] (C9 has 3 and C20 has 4 there; C3 has 10.1M).
CRITEO_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10_000_000, 2_202_608, 305, 24, 12_517, 633, 10, 93_145,
    5_683, 8_351_593, 3_194, 27, 14_992, 5_461_306, 10, 5_652, 2_173, 10,
    7_046_547, 18, 15, 286_181, 105, 142_572,
)  # fmt: skip

#: Generator version written to ``_synthetic.json``: version 2 is the default
#: hidden model of the module doc; ``SyntheticConfig(**V1_MODEL)`` draws
#: version 1's data.
GENERATOR_VERSION = 2

#: The hidden-model settings of generator version 1: numeric effects on the
#: latent ``z``, the same weight spread for every id, independent weights for
#: every value pair of four crosses (two of them on columns of 305 and 583 ids).
V1_MODEL: dict[str, Any] = {
    "id_weight_stds": (
        (1, 0.3), (2, 0.3), (3, 0.5), (4, 0.4), (6, 0.3), (7, 0.3), (10, 0.4),
        (12, 0.5), (14, 0.3), (16, 0.4), (17, 0.3), (21, 0.3), (24, 0.3), (26, 0.3),
    ),
    "crosses": ((6, 14, 0.4), (9, 20, 0.3), (2, 23, 0.3), (5, 25, 0.3)),
    "numeric_effects": (
        0.25, -0.15, 0.0, 0.2, 0.0, 0.15, 0.3, 0.0, 0.1, 0.2, 0.25, 0.0, 0.1,
    ),
    "numeric_effect_on_value": False,
    "id_weight_tail_rank": None,
    "cross_rank": None,
}  # fmt: skip

_MAX_CARDINALITY = 1 << 31
_MAX_DAYS = 3660
_MAX_ROWS = 100_000_000  # per day: 8 hex chars x rows must fit Arrow's int32 string offsets
_SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MASK53 = 2.0**-53


@dataclass(frozen=True)
class SyntheticConfig:
    """Pinned parameters of the synthetic data; the defaults are documented here.

    Attributes:
        rows_per_day: Rows in each training day.
        num_days: Training days, consecutive from ``start_date``.
        test_rows: Rows of the held-out test split (the day after the last
            training day); ``None`` means ``rows_per_day``.
        parts_per_day: Parquet files per day (contiguous slices of its rows).
        row_group_rows: Rows per Parquet row group.
        start_date: ISO date of the first training day (directory ``YYYY-MM-DD``).
        base_ctr: Target mean of ``p_true`` (the mean click rate), in [0.01, 0.5].
        seed: Seed of every random draw and hash; any int in [0, 2**63).
        cardinalities: Base vocabulary size of ``C1`` .. ``C26`` (26 ints).
        zipf_exponent: Power-law exponent of the id frequencies, in (0, 3].
        new_id_share: Share of the values of a churning column that are ids
            never seen on an earlier day, in [0, 1).
        churn_min_cardinality: Columns with at least this many base ids churn.
        categorical_missing_rates: Missing rate of ``C1`` .. ``C26``, each in [0, 1).
        numeric_missing_rates: Missing rate of ``I1`` .. ``I13``, each in [0, 1).
        numeric_log_means: ``log_mean`` of ``I1`` .. ``I13`` (see the module doc).
        numeric_log_stds: ``log_std`` of ``I1`` .. ``I13``, each > 0.
        id_weight_stds: ``(column number 1..26, std)`` pairs: the columns whose
            ids carry a weight in the hidden model, and the weights' spread.
        crosses: ``(column a, column b, std)``: pairs of columns whose value
            pairs carry a weight of spread ``std`` (feature crosses).
        numeric_effects: Coefficient of each numeric feature ``x_j`` in the logit.
        numeric_effect_on_value: The numeric term reads the written value
            (``x_j``, see the module doc); False: the latent ``z_j`` (version 1).
        id_weight_tail_rank: Ids of rank below it carry the column's full weight
            spread; above it the spread falls as ``(tail_rank / (r + 1)) **
            id_weight_tail_power``. ``None``: every id has the full spread (version 1).
        id_weight_tail_power: How fast the tail's spread falls, in (0, 4].
        cross_rank: Rank of the cross weights (the length of each id's cross
            factor), in [1, 64]; ``None``: independent pair weights (version 1).

    Example:
        >>> cfg = SyntheticConfig(rows_per_day=50_000, num_days=2, base_ctr=0.05)
        >>> cfg.days
        ('2024-05-10', '2024-05-11')
    """

    rows_per_day: int = 100_000
    num_days: int = 3
    test_rows: int | None = None
    parts_per_day: int = 1
    row_group_rows: int = 65_536
    start_date: str = "2024-05-10"
    base_ctr: float = 0.10
    seed: int = 0
    cardinalities: tuple[int, ...] = CRITEO_CARDINALITIES
    zipf_exponent: float = 1.1
    new_id_share: float = 0.05
    churn_min_cardinality: int = 10_000
    categorical_missing_rates: tuple[float, ...] = (
        0.0, 0.0, 0.034, 0.034, 0.0, 0.121, 0.0, 0.0005, 0.0, 0.0, 0.0, 0.034, 0.0,
        0.0, 0.0, 0.034, 0.0, 0.0, 0.44, 0.44, 0.034, 0.0, 0.0, 0.034, 0.44, 0.44,
    )  # fmt: skip
    numeric_missing_rates: tuple[float, ...] = (
        0.45, 0.0, 0.21, 0.22, 0.026, 0.22, 0.043, 0.0005, 0.043, 0.45, 0.043, 0.77, 0.22,
    )  # fmt: skip
    numeric_log_means: tuple[float, ...] = (
        0.5, 1.0, 1.8, 1.6, 6.5, 3.0, 1.0, 2.3, 3.0, 0.3, 0.7, 0.2, 1.5,
    )  # fmt: skip
    numeric_log_stds: tuple[float, ...] = (
        1.2, 1.5, 1.3, 0.9, 2.0, 1.9, 1.4, 1.0, 1.3, 0.6, 0.9, 1.0, 1.1,
    )  # fmt: skip
    id_weight_stds: tuple[tuple[int, float], ...] = (
        (1, 0.25), (2, 0.25), (3, 0.15), (4, 0.15), (5, 0.25), (6, 0.4), (7, 0.25),
        (10, 0.15), (12, 0.15), (14, 0.4), (16, 0.15), (17, 0.4), (19, 0.25), (21, 0.15),
        (24, 0.15), (26, 0.15),
    )  # fmt: skip
    crosses: tuple[tuple[int, int, float], ...] = (
        (9, 20, 0.5), (17, 23, 0.5), (22, 20, 0.5), (6, 9, 0.5),
    )  # fmt: skip
    numeric_effects: tuple[float, ...] = (
        0.35, -0.2, 0.0, 0.3, 0.0, 0.2, 0.45, 0.0, 0.15, 0.3, 0.35, 0.0, 0.15,
    )  # fmt: skip
    numeric_effect_on_value: bool = True
    id_weight_tail_rank: int | None = 50
    id_weight_tail_power: float = 1.5
    cross_rank: int | None = 1

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def days(self) -> tuple[str, ...]:
        """The training days as ``YYYY-MM-DD`` strings, oldest first."""
        start = datetime.date.fromisoformat(self.start_date)
        return tuple((start + datetime.timedelta(days=d)).isoformat() for d in range(self.num_days))

    @property
    def test_day(self) -> str:
        """The date the test split is drawn for: the day after the last training day."""
        start = datetime.date.fromisoformat(self.start_date)
        return (start + datetime.timedelta(days=self.num_days)).isoformat()

    def rows_of(self, day_index: int) -> int:
        """Return the row count of training day ``day_index`` (``num_days`` = test)."""
        if day_index == self.num_days and self.test_rows is not None:
            return self.test_rows
        return self.rows_per_day


@dataclass(frozen=True)
class GeneratedData:
    """What :func:`generate` wrote.

    Attributes:
        out_dir: The root directory.
        config: The config the data was drawn with.
        days: The training days (``YYYY-MM-DD``), oldest first.
        train_files: For each training day, its Parquet files in order.
        test_day: The date of the test split.
        test_files: The Parquet files of the test split, in order.
        bias: The hidden model's bias (solved on the first training day).
        ctr_by_day: Mean label per training day and for ``"test"``.
        optimal_auc: AUC of ``p_true`` against ``label`` on the test split: the
            best AUC any model can expect there (about 0.82 at the
            defaults; NaN if the test split has a single class).
    """

    out_dir: Path
    config: SyntheticConfig
    days: tuple[str, ...]
    train_files: dict[str, tuple[Path, ...]]
    test_day: str
    test_files: tuple[Path, ...]
    bias: float
    ctr_by_day: dict[str, float]
    optimal_auc: float


def generate(
    out_dir: str | Path, config: SyntheticConfig | None = None, *, overwrite: bool = False
) -> GeneratedData:
    """Write the training days and the test split of a synthetic data set.

    Args:
        out_dir: Root directory; created if missing.
        config: The parameters; ``None`` means ``SyntheticConfig()``.
        overwrite: Replace files of an earlier run in ``out_dir``. Without it,
            an ``out_dir`` that already holds any of the day directories, the
            test directory or ``_synthetic.json`` is refused.

    Returns:
        The paths written, the hidden bias, the CTR per day and the optimal AUC.

    Raises:
        ArgumentError: ``config`` is not a ``SyntheticConfig``, or ``out_dir``
            holds an earlier run and ``overwrite`` is False.
    """
    config = SyntheticConfig() if config is None else config
    if not isinstance(config, SyntheticConfig):
        raise ArgumentError(
            f"generate: `config` must be a SyntheticConfig. Received: {type(config).__name__}."
        )
    root = Path(out_dir)
    dirs = [root / dt for dt in config.days] + [root / "test"]
    if not overwrite:
        taken = [p for p in [*dirs, root / "_synthetic.json"] if p.exists()]
        if taken:
            raise ArgumentError(
                f"generate: `out_dir` {str(root)!r} already holds generated data "
                f"({taken[0].name}); pass overwrite=True to replace it."
            )
    sampler = _DaySampler(config)
    day0 = sampler.sample(0)
    bias = _solve_bias(day0.logit, config.base_ctr)
    pending: _DaySample | None = day0
    del day0
    train_files: dict[str, tuple[Path, ...]] = {}
    ctr_by_day: dict[str, float] = {}
    optimal_auc = float("nan")
    test_files: tuple[Path, ...] = ()
    for d in range(config.num_days + 1):
        sample = pending if pending is not None else sampler.sample(d)
        pending = None  # let day 0 be freed once written
        table, labels, p_true = sample.to_table(bias, _rng(config.seed, d, _LABEL_STREAM))
        is_test = d == config.num_days
        name = "test" if is_test else config.days[d]
        files = _write_parts(table, root / name, config)
        ctr_by_day[name] = float(labels.mean())
        if is_test:
            test_files = files
            optimal_auc = exact_auc(labels, p_true)  # NaN if the split has a single class
        else:
            train_files[name] = files
        del sample, table
    result = GeneratedData(
        out_dir=root,
        config=config,
        days=config.days,
        train_files=train_files,
        test_day=config.test_day,
        test_files=test_files,
        bias=bias,
        ctr_by_day=ctr_by_day,
        optimal_auc=optimal_auc,
    )
    _write_meta(result)
    return result


# --------------------------------------------------------------------------- config checks


def _fail(name: str, expected: str, value: object) -> ArgumentError:
    return ArgumentError(
        f"SyntheticConfig: `{name}` must be {expected}. Received: {name}={value!r}."
    )


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not ok or not lo <= int(value) <= hi:  # type: ignore[call-overload]
        raise _fail(name, f"an int in [{lo}, {hi}]", value)


def _check_rates(name: str, values: Sequence[float], n: int) -> None:
    if len(values) != n or not all(isinstance(v, float | int) and 0 <= v < 1 for v in values):
        raise _fail(name, f"{n} floats in [0, 1)", values)


def _validate(c: SyntheticConfig) -> None:
    _check_int("rows_per_day", c.rows_per_day, 1, _MAX_ROWS)
    _check_int("num_days", c.num_days, 1, _MAX_DAYS)
    if c.test_rows is not None:
        _check_int("test_rows", c.test_rows, 1, _MAX_ROWS)
    _check_int("parts_per_day", c.parts_per_day, 1, min(c.rows_per_day, c.test_rows or 1 << 32))
    _check_int("row_group_rows", c.row_group_rows, 1, 1 << 31)
    _check_int("seed", c.seed, 0, (1 << 63) - 1)
    _check_int("churn_min_cardinality", c.churn_min_cardinality, 0, 1 << 62)
    try:
        datetime.date.fromisoformat(c.start_date)
    except (TypeError, ValueError):
        raise _fail("start_date", "an ISO date like '2024-05-10'", c.start_date) from None
    if not (isinstance(c.base_ctr, float | int) and 0.01 <= c.base_ctr <= 0.5):
        raise _fail("base_ctr", "a float in [0.01, 0.5]", c.base_ctr)
    if not (isinstance(c.zipf_exponent, float | int) and 0 < c.zipf_exponent <= 3):
        raise _fail("zipf_exponent", "a float in (0, 3]", c.zipf_exponent)
    if not (isinstance(c.new_id_share, float | int) and 0 <= c.new_id_share < 1):
        raise _fail("new_id_share", "a float in [0, 1)", c.new_id_share)
    if len(c.cardinalities) != 26 or not all(
        isinstance(k, int) and 1 <= k <= _MAX_CARDINALITY for k in c.cardinalities
    ):
        raise _fail("cardinalities", f"26 ints in [1, {_MAX_CARDINALITY}]", c.cardinalities)
    _check_rates("categorical_missing_rates", c.categorical_missing_rates, 26)
    _check_rates("numeric_missing_rates", c.numeric_missing_rates, 13)
    for name, values, positive in (
        ("numeric_log_means", c.numeric_log_means, False),
        ("numeric_log_stds", c.numeric_log_stds, True),
        ("numeric_effects", c.numeric_effects, False),
    ):
        if len(values) != 13 or not all(
            isinstance(v, float | int) and math.isfinite(v) and (v > 0 or not positive)
            for v in values
        ):
            kind = "positive finite floats" if positive else "finite floats"
            raise _fail(name, f"13 {kind}", values)
    _validate_model_columns(c)
    if not isinstance(c.numeric_effect_on_value, bool):
        raise _fail("numeric_effect_on_value", "a bool", c.numeric_effect_on_value)
    if c.id_weight_tail_rank is not None:
        _check_int("id_weight_tail_rank", c.id_weight_tail_rank, 1, 1 << 62)
    power = c.id_weight_tail_power
    if not (isinstance(power, float | int) and not isinstance(power, bool) and 0 < power <= 4):
        raise _fail("id_weight_tail_power", "a float in (0, 4]", power)
    if c.cross_rank is not None:
        _check_int("cross_rank", c.cross_rank, 1, 64)
    # Ids are written as 32-bit tokens: base ids and every day's new ids must fit.
    rows = max(c.rows_per_day, c.test_rows or 0)
    if max(c.cardinalities) + (c.num_days + 1) * rows > 1 << 32:
        raise ArgumentError(
            "SyntheticConfig: ids must fit in 32 bits: max(cardinalities) + "
            "(num_days + 1) * rows_per_day must be <= 2**32. "
            f"Received: {max(c.cardinalities)} + {c.num_days + 1} * {rows}."
        )


def _validate_model_columns(c: SyntheticConfig) -> None:
    def col_ok(j: object) -> bool:
        return isinstance(j, int) and 1 <= j <= 26

    def std_ok(v: object) -> bool:
        return isinstance(v, float | int) and math.isfinite(v) and v >= 0

    pairs_ok = all(len(p) == 2 and col_ok(p[0]) and std_ok(p[1]) for p in c.id_weight_stds)
    if not pairs_ok or len({p[0] for p in c.id_weight_stds}) != len(c.id_weight_stds):
        raise _fail("id_weight_stds", "distinct (column 1..26, std >= 0) pairs", c.id_weight_stds)
    if not all(
        len(x) == 3 and col_ok(x[0]) and col_ok(x[1]) and x[0] != x[1] and std_ok(x[2])
        for x in c.crosses
    ):
        raise _fail("crosses", "(column a, column b != a, std >= 0) triples", c.crosses)


# --------------------------------------------------------------------------- sampling

_LABEL_STREAM = 1000  # stream ids below 1000 belong to columns (see _DaySampler)


def _rng(seed: int, day: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(day, stream)))


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Return SplitMix64's finaliser of ``x + gamma`` (a bijection on uint64)."""
    z = x + _SPLITMIX_GAMMA
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _salt(seed: int, *parts: int) -> np.uint64:
    """Return a uint64 salt mixed from the seed and small ints (column, purpose)."""
    h = _splitmix64(np.array([seed], dtype=np.uint64))
    for p in parts:
        h = _splitmix64(h ^ np.uint64(p))
    return np.uint64(h[0])


def _hash_normal(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """Map hashes to N(0, 1) values (Box-Muller on two derived uniforms)."""
    a = _splitmix64(h)
    b = _splitmix64(a)
    u1 = 1.0 - (a >> np.uint64(11)).astype(np.float64) * _MASK53  # (0, 1]
    u2 = (b >> np.uint64(11)).astype(np.float64) * _MASK53  # [0, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _fmix32(x: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """Return MurmurHash3's 32-bit finaliser (a bijection on uint32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    return x ^ (x >> np.uint32(16))


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(28, -1, -4, dtype=np.uint32)  # [8]


def _hex_strings(tokens: npt.NDArray[np.uint32], valid: npt.NDArray[np.bool_]) -> pa.Array:
    """Build an Arrow string array of 8 hex characters per token, null where not valid."""
    n = tokens.shape[0]
    chars = _HEX[(tokens[:, None] >> _NIBBLE_SHIFTS) & np.uint32(0xF)]  # [n, 8] uint8
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)  # [n + 1]
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(
        pa.string(),
        n,
        [pa.py_buffer(bitmap), pa.py_buffer(offsets), pa.py_buffer(chars.reshape(-1))],
        null_count=int(n - np.count_nonzero(valid)),
    )


def _zipf_ranks(rng: np.random.Generator, n: int, k: int, s: float) -> npt.NDArray[np.int64]:
    """Draw ``n`` ranks in [0, k) with P(rank r) ~ (r + 1) ** -s (bounded Pareto, floored)."""
    u = rng.random(n)  # [n]
    if abs(s - 1.0) < 1e-9:
        x = np.exp(u * math.log(k + 1.0))
    else:
        a = 1.0 - s
        x = (1.0 + u * ((k + 1.0) ** a - 1.0)) ** (1.0 / a)
    return np.minimum(x.astype(np.int64) - 1, k - 1)


@dataclass
class _DaySample:
    """One day's features (as Arrow arrays) and its logit without the bias."""

    day: int
    row_id_start: int
    numeric: list[pa.Array]
    categorical: list[pa.Array]
    logit: npt.NDArray[np.float64]

    def to_table(
        self, bias: float, label_rng: np.random.Generator
    ) -> tuple[pa.Table, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        z = self.logit + bias
        p_true = 0.5 * (1.0 + np.tanh(0.5 * z))  # sigmoid without overflow
        labels = (label_rng.random(z.shape[0]) < p_true).astype(np.int64)
        row_id = np.arange(self.row_id_start, self.row_id_start + z.shape[0], dtype=np.int64)
        arrays = [pa.array(labels), *self.numeric, *self.categorical]
        arrays += [pa.array(p_true), pa.array(row_id)]
        return pa.Table.from_arrays(arrays, schema=SCHEMA), labels, p_true


class _DaySampler:
    """Draws days of features from a config; the hidden model's hashes live here."""

    def __init__(self, config: SyntheticConfig) -> None:
        self.c = config
        self.weight_std = dict(config.id_weight_stds)
        self.cross_cols = {a for a, _, _ in config.crosses} | {b for _, b, _ in config.crosses}
        self.max_rows = max(config.rows_per_day, config.test_rows or 0)

    def sample(self, day: int) -> _DaySample:
        c = self.c
        n = c.rows_of(day)
        logit = np.zeros(n, dtype=np.float64)  # [B]
        numeric = []
        for j in range(13):
            values, valid, term = self.numeric(day, j, n)
            logit += term
            numeric.append(pa.array(values, mask=~valid))
        ids: dict[int, tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]] = {}
        categorical = []
        for col in range(1, 27):
            col_ids, valid = self.ids(day, col, n)
            if self.weight_std.get(col, 0.0) > 0:
                logit += np.where(valid, self.id_weight(col, col_ids), 0.0)
            token = _fmix32((col_ids + _salt(c.seed, col, 2)).astype(np.uint32))
            categorical.append(_hex_strings(token, valid))
            if col in self.cross_cols:
                ids[col] = (col_ids, valid)
        for a, b, std in c.crosses:
            (ia, va), (ib, vb) = ids[a], ids[b]
            logit += np.where(va & vb, self.cross_weight(a, ia, b, ib, std), 0.0)
        return _DaySample(day, day * c.rows_per_day, numeric, categorical, logit)

    def id_weight_std(self, col: int, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
        """Return the spread ``[B]`` of the hidden weight of each id of column ``col``."""
        c = self.c
        std = np.full(ids.shape[0], self.weight_std.get(col, 0.0))  # [B]
        if c.id_weight_tail_rank is None:
            return std
        # The id is its rank (new ids are >= cardinality): the tail's spread shrinks.
        ratio = c.id_weight_tail_rank / (ids.astype(np.float64) + 1.0)  # [B]
        return std * np.minimum(1.0, ratio) ** c.id_weight_tail_power

    def id_weight(self, col: int, ids: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
        """Return the hidden weight ``[B]`` of each id of column ``col``."""
        return self.id_weight_std(col, ids) * _hash_normal(ids ^ _salt(self.c.seed, col, 1))

    def cross_weight(
        self,
        a: int,
        ids_a: npt.NDArray[np.uint64],
        b: int,
        ids_b: npt.NDArray[np.uint64],
        std: float,
    ) -> npt.NDArray[np.float64]:
        """Return the hidden weight ``[B]`` of each value pair of the cross ``(a, b)``."""
        c = self.c
        if c.cross_rank is None:  # an independent N(0, std^2) weight per value pair
            h = _splitmix64(ids_a ^ _salt(c.seed, a, b, 3)) + ids_b  # [B]
            return std * _hash_normal(h)
        dot = np.zeros(ids_a.shape[0], dtype=np.float64)  # [B]
        for t in range(c.cross_rank):
            dot += self.cross_factor(a, ids_a, t) * self.cross_factor(b, ids_b, t)
        return std * dot / math.sqrt(c.cross_rank)

    def cross_factor(
        self, col: int, ids: npt.NDArray[np.uint64], t: int
    ) -> npt.NDArray[np.float64]:
        """Return coordinate ``t`` of the ids' cross factors ``u`` (N(0, 1), per column and id)."""
        return _hash_normal(ids ^ _salt(self.c.seed, col, 4, t))

    def numeric_feature(self, j: int, values: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Return ``x_j = (log1p(value) - log_mean_j) / log_std_j`` ``[B]`` of written values."""
        mean, std = self.c.numeric_log_means[j], self.c.numeric_log_stds[j]
        return (np.log1p(values.astype(np.float64)) - mean) / std

    def numeric(
        self, day: int, j: int, n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """Draw ``I{j+1}`` for a day: values ``[B]``, valid mask ``[B]``, logit term ``[B]``."""
        c = self.c
        rng = _rng(c.seed, day, 100 + j)
        z = rng.standard_normal(n)  # [B] latent
        valid = rng.random(n) >= c.numeric_missing_rates[j]  # [B]
        log_value = np.maximum(c.numeric_log_means[j] + c.numeric_log_stds[j] * z, 0.0)
        values = np.floor(np.expm1(np.minimum(log_value, 40.0))).astype(np.int64)  # [B]
        term = np.zeros(n, dtype=np.float64)  # [B]
        if c.numeric_effects[j] != 0:
            x = self.numeric_feature(j, values) if c.numeric_effect_on_value else z  # [B]
            term = np.where(valid, c.numeric_effects[j] * x, 0.0)
        return values, valid, term

    def ids(
        self, day: int, col: int, n: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
        """Draw column ``col``'s ids for a day: base ids < K, new ids K + day * rows + j."""
        c = self.c
        k = c.cardinalities[col - 1]
        rng = _rng(c.seed, day, col)
        ids = _zipf_ranks(rng, n, k, c.zipf_exponent).astype(np.uint64)  # [B]
        valid = rng.random(n) >= c.categorical_missing_rates[col - 1]  # [B]
        if c.new_id_share > 0 and k >= c.churn_min_cardinality:
            is_new = rng.random(n) < c.new_id_share  # [B]
            pool = max(1, round(c.new_id_share * n / 2))
            new = rng.integers(0, pool, size=n, dtype=np.int64)  # [B]
            first_new = k + day * self.max_rows
            ids = np.where(is_new, (new + first_new).astype(np.uint64), ids)
        return ids, valid


def _solve_bias(logit: npt.NDArray[np.float64], base_ctr: float) -> float:
    """Return b such that mean(sigmoid(logit + b)) == base_ctr (bisection to 1e-12)."""
    lo, hi = -40.0, 40.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        ctr = float(np.mean(0.5 * (1.0 + np.tanh(0.5 * (logit + mid)))))
        if ctr < base_ctr:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------- writing


def _write_parts(table: pa.Table, day_dir: Path, config: SyntheticConfig) -> tuple[Path, ...]:
    day_dir.mkdir(parents=True, exist_ok=True)
    for old in day_dir.glob("part-*.parquet"):
        old.unlink()  # a rerun with fewer parts must not leave stale files behind
    n = table.num_rows
    bounds = [n * i // config.parts_per_day for i in range(config.parts_per_day + 1)]
    paths = []
    for i in range(config.parts_per_day):
        path = day_dir / f"part-{i:05d}.parquet"
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        pq.write_table(part, path, row_group_size=config.row_group_rows, compression="snappy")
        paths.append(path)
    return tuple(paths)


def _write_meta(data: GeneratedData) -> None:
    config: dict[str, Any] = dataclasses.asdict(data.config)
    meta = {
        "format": "tnrec.synthetic",
        "version": GENERATOR_VERSION,
        "config": config,
        "days": list(data.days),
        "test_day": data.test_day,
        "bias": data.bias,
        "ctr_by_day": data.ctr_by_day,
        "optimal_auc": data.optimal_auc,
    }
    text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    (data.out_dir / "_synthetic.json").write_text(text, encoding="utf-8")
