"""Tests of tnrec.data.synthetic: layout, schema, determinism, CTR, churn, AUC, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tnrec.data.synthetic import (
    CATEGORICAL_COLUMNS,
    NUMERIC_COLUMNS,
    SCHEMA,
    V1_MODEL,
    GeneratedData,
    SyntheticConfig,
    _DaySampler,
    generate,
)
from tnrec.errors import ArgumentError
from tnrec.metrics import exact_auc

SMALL = SyntheticConfig(rows_per_day=20_000, num_days=2, test_rows=10_000, seed=7)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> GeneratedData:
    return generate(tmp_path_factory.mktemp("syn") / "data", SMALL)


def _read_day(files: tuple[Path, ...]):
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(f) for f in files])


def test_layout_days_and_test_split(small: GeneratedData) -> None:
    assert small.days == ("2024-05-10", "2024-05-11")
    assert small.test_day == "2024-05-12"
    for dt in small.days:
        assert small.train_files[dt] == (small.out_dir / dt / "part-00000.parquet",)
    assert small.test_files == (small.out_dir / "test" / "part-00000.parquet",)
    meta = json.loads((small.out_dir / "_synthetic.json").read_text())
    assert meta["days"] == list(small.days)
    assert meta["config"]["rows_per_day"] == 20_000
    assert meta["optimal_auc"] == small.optimal_auc


def test_schema_values_and_row_ids(small: GeneratedData) -> None:
    tables = [_read_day(small.train_files[dt]) for dt in small.days]
    tables.append(_read_day(small.test_files))
    assert [t.num_rows for t in tables] == [20_000, 20_000, 10_000]
    hex8 = re.compile(r"^[0-9a-f]{8}$")
    for t in tables:
        assert t.schema.equals(SCHEMA)
        assert set(np.unique(t["label"].to_numpy())) <= {0, 1}
        p = t["p_true"].to_numpy()
        assert np.all((p > 0) & (p < 1))
        for c in CATEGORICAL_COLUMNS:
            values = t[c].drop_null().to_pylist()
            assert all(hex8.match(v) for v in values[:200]), c
        for c in NUMERIC_COLUMNS:
            assert t[c].drop_null().to_numpy().min() >= 0, c
    # Missing rates close to the config (C19 and I12 are often missing, C1 never).
    day0 = tables[0]
    assert day0["C1"].null_count == 0
    assert day0["C19"].null_count / day0.num_rows == pytest.approx(0.44, abs=0.02)
    assert day0["I12"].null_count / day0.num_rows == pytest.approx(0.77, abs=0.02)
    row_ids = np.concatenate([t["row_id"].to_numpy() for t in tables])
    assert np.unique(row_ids).size == row_ids.size


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    cfg = SyntheticConfig(rows_per_day=3_000, num_days=2, parts_per_day=2, seed=3)
    a = generate(tmp_path / "a", cfg)
    b = generate(tmp_path / "b", cfg)
    c = generate(tmp_path / "c", SyntheticConfig(rows_per_day=3_000, num_days=2, seed=4))
    files_a = sorted(p.relative_to(a.out_dir) for p in a.out_dir.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b.out_dir) for p in b.out_dir.rglob("*") if p.is_file())
    assert files_a == files_b
    assert len(files_a) == 2 * 2 + 2 + 1  # 2 parts x 2 days, test split in 2 parts, meta
    for rel in files_a:
        assert (a.out_dir / rel).read_bytes() == (b.out_dir / rel).read_bytes(), rel
    t_a = _read_day(a.train_files["2024-05-10"])
    t_c = _read_day(c.train_files["2024-05-10"])
    assert t_a["C3"].to_pylist() != t_c["C3"].to_pylist()


def test_parts_split_a_day_contiguously(tmp_path: Path) -> None:
    cfg = SyntheticConfig(rows_per_day=1_000, num_days=1, parts_per_day=3, row_group_rows=100)
    data = generate(tmp_path, cfg)
    files = data.train_files["2024-05-10"]
    assert [f.name for f in files] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
    assert sizes == [333, 333, 334]
    assert pq.ParquetFile(files[0]).metadata.num_row_groups == 4
    row_ids = np.concatenate([pq.read_table(f)["row_id"].to_numpy() for f in files])
    np.testing.assert_array_equal(row_ids, np.arange(1_000))


@pytest.mark.parametrize(
    "base_ctr",
    [
        pytest.param(0.03, id="ctr3"),
        pytest.param(0.25, id="ctr25"),
    ],
)
def test_ctr_hits_base(tmp_path: Path, base_ctr: float) -> None:
    cfg = SyntheticConfig(rows_per_day=40_000, num_days=2, base_ctr=base_ctr, seed=1)
    data = generate(tmp_path, cfg)
    day0 = _read_day(data.train_files["2024-05-10"])
    # The bias is solved on day 0: the mean true probability there is exact.
    assert day0["p_true"].to_numpy().mean() == pytest.approx(base_ctr, rel=1e-6)
    for name, ctr in data.ctr_by_day.items():
        assert ctr == pytest.approx(base_ctr, rel=0.15), name


def test_new_id_share_on_day_two(tmp_path: Path) -> None:
    # Few base ids, so every base id already shows on day 1 and only new ids are unseen.
    cfg = SyntheticConfig(
        rows_per_day=20_000,
        num_days=2,
        cardinalities=(50,) * 26,
        new_id_share=0.1,
        churn_min_cardinality=40,
        categorical_missing_rates=(0.0,) * 26,
    )
    data = generate(tmp_path, cfg)
    day1 = _read_day(data.train_files["2024-05-10"])
    day2 = _read_day(data.train_files["2024-05-11"])
    for col in ("C1", "C26"):
        seen = set(day1[col].to_pylist())
        values = day2[col].to_pylist()
        unseen = np.mean([v not in seen for v in values])
        assert unseen == pytest.approx(0.1, abs=0.01), col
        assert len(set(values) - seen) > 500  # many distinct new ids, not one


def test_no_churn_below_min_cardinality(tmp_path: Path) -> None:
    cfg = SyntheticConfig(
        rows_per_day=20_000, num_days=2, cardinalities=(50,) * 26, churn_min_cardinality=51
    )
    data = generate(tmp_path, cfg)
    day1 = _read_day(data.train_files["2024-05-10"])
    day2 = _read_day(data.train_files["2024-05-11"])
    assert set(day2["C1"].to_pylist()) <= set(day1["C1"].to_pylist())


def test_optimal_auc_is_auc_of_p_true(small: GeneratedData) -> None:
    test = _read_day(small.test_files)
    auc = exact_auc(test["label"].to_numpy(), test["p_true"].to_numpy())
    assert auc == small.optimal_auc
    assert 0.65 < small.optimal_auc < 0.95


def test_tail_shrinkage_narrows_rare_ids_weights() -> None:
    cols = ((3, 0.5),)
    cfg = SyntheticConfig(id_weight_stds=cols, id_weight_tail_rank=100, id_weight_tail_power=1.0)
    sampler = _DaySampler(cfg)
    head = np.arange(100, dtype=np.uint64)  # ranks 0..99: the full spread
    tail = np.arange(10_000, 20_000, dtype=np.uint64)  # ranks >= 10,000: std * 100/(r+1)
    np.testing.assert_allclose(sampler.id_weight_std(3, head), 0.5)
    np.testing.assert_allclose(sampler.id_weight_std(3, tail), 0.5 * 100 / (tail + 1.0))
    assert np.std(sampler.id_weight(3, tail)) < 0.05 * np.std(sampler.id_weight(3, head))
    # Churned ids are numbered from the cardinality up: the smallest weights of all.
    new = np.arange(10_000_000, 10_001_000, dtype=np.uint64)
    assert np.abs(sampler.id_weight(3, new)).max() < 5e-5  # std 0.5 * 100 / 1e7
    # None: every rank keeps the column's std (the version-1 model).
    flat = _DaySampler(SyntheticConfig(id_weight_stds=cols, id_weight_tail_rank=None))
    np.testing.assert_allclose(flat.id_weight_std(3, tail), 0.5)
    assert np.std(flat.id_weight(3, tail)) == pytest.approx(0.5, rel=0.05)


def test_cross_weights_are_low_rank_or_independent() -> None:
    a = np.repeat(np.arange(30, dtype=np.uint64), 30)  # all 30 x 30 value pairs of C9 x C20
    b = np.tile(np.arange(30, dtype=np.uint64), 30)
    for rank in (1, 4):
        w = _DaySampler(SyntheticConfig(cross_rank=rank)).cross_weight(9, a, 20, b, 0.4)
        assert np.linalg.matrix_rank(w.reshape(30, 30), tol=1e-9) == rank
        assert np.std(w) == pytest.approx(0.4, rel=0.25)
    w = _DaySampler(SyntheticConfig(cross_rank=None)).cross_weight(9, a, 20, b, 0.4)
    assert np.linalg.matrix_rank(w.reshape(30, 30), tol=1e-9) == 30
    # Independent pair weights: knowing a row of pairs tells nothing of another.
    m = w.reshape(30, 30)
    assert abs(np.corrcoef(m[0], m[1])[0, 1]) < 0.5
    assert np.std(w) == pytest.approx(0.4, rel=0.15)


def test_numeric_effect_uses_the_written_value(tmp_path: Path) -> None:
    effects = (0.0,) * 6 + (0.5,) + (0.0,) * 6  # only I7 acts
    base = dict(
        rows_per_day=5_000,
        num_days=1,
        test_rows=100,
        numeric_effects=effects,
        id_weight_stds=(),
        crosses=(),
    )
    t = _read_day(generate(tmp_path / "v", SyntheticConfig(**base)).train_files["2024-05-10"])
    i7 = t["I7"].to_numpy(zero_copy_only=False)  # float, NaN where missing
    logit = np.log(t["p_true"].to_numpy() / (1.0 - t["p_true"].to_numpy()))
    x = (np.log1p(i7) - 1.0) / 1.4  # I7: log_mean 1.0, log_std 1.4
    ok = ~np.isnan(i7)
    # The logit is bias + 0.5 * x exactly, and rows with equal values share it.
    slope, icept = np.polyfit(x[ok], logit[ok], 1)
    assert slope == pytest.approx(0.5, abs=1e-9)
    np.testing.assert_allclose(logit[ok], icept + 0.5 * x[ok], atol=1e-9)
    np.testing.assert_allclose(logit[~ok], icept, atol=1e-9)  # missing: 0
    # The version-1 model acts on the latent z instead: equal values, other logits.
    old = SyntheticConfig(**base, numeric_effect_on_value=False)
    t = _read_day(generate(tmp_path / "z", old).train_files["2024-05-10"])
    zero = t["I7"].to_numpy(zero_copy_only=False) == 0
    assert np.ptp(t["p_true"].to_numpy()[zero]) > 0.01


def test_version_1_model_reproduces_the_old_data(tmp_path: Path) -> None:
    cfg = SyntheticConfig(rows_per_day=2_000, num_days=1, test_rows=1_000, seed=5, **V1_MODEL)
    data = generate(tmp_path, cfg)
    p = pq.read_table(data.train_files["2024-05-10"][0])["p_true"].to_numpy()
    # Measured with version 1 of the generator (tnrec before the learnable defaults).
    assert data.bias == pytest.approx(-2.853256404717115, rel=1e-9)
    assert data.optimal_auc == pytest.approx(0.8591146332120283, rel=1e-9)
    expected = [0.07990255961817944, 0.041243186039969515, 0.2889603175998414]
    np.testing.assert_allclose(p[:3], expected, rtol=1e-9)
    assert json.loads((tmp_path / "_synthetic.json").read_text())["version"] == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows_per_day": 0}, r"`rows_per_day` must be an int in \[1, .*rows_per_day=0"),
        ({"test_rows": 100_000_001}, r"`test_rows` must be an int in \[1, 100000000\]"),
        ({"num_days": 1.5}, r"`num_days` must be an int"),
        ({"test_rows": -1}, r"`test_rows` must be an int"),
        ({"rows_per_day": 10, "parts_per_day": 11}, r"`parts_per_day` must be an int in \[1, 10\]"),
        ({"seed": -1}, r"`seed` must be an int"),
        ({"base_ctr": 0.9}, r"`base_ctr` must be a float in \[0.01, 0.5\]"),
        ({"zipf_exponent": 0.0}, r"`zipf_exponent` must be a float in \(0, 3\]"),
        ({"new_id_share": 1.0}, r"`new_id_share` must be a float in \[0, 1\)"),
        ({"start_date": "10/05/2024"}, r"`start_date` must be an ISO date"),
        ({"cardinalities": (10,) * 25}, r"`cardinalities` must be 26 ints"),
        ({"cardinalities": (0,) * 26}, r"`cardinalities` must be 26 ints"),
        ({"categorical_missing_rates": (1.0,) * 26}, r"`categorical_missing_rates` must be 26"),
        ({"numeric_missing_rates": (0.1,) * 12}, r"`numeric_missing_rates` must be 13"),
        ({"numeric_log_stds": (0.0,) * 13}, r"`numeric_log_stds` must be 13 positive"),
        ({"numeric_log_means": (float("inf"),) * 13}, r"`numeric_log_means` must be 13 finite"),
        ({"numeric_effects": (0.1,) * 14}, r"`numeric_effects` must be 13 finite"),
        ({"id_weight_stds": ((27, 0.1),)}, r"`id_weight_stds` must be distinct"),
        ({"id_weight_stds": ((1, 0.1), (1, 0.2))}, r"`id_weight_stds` must be distinct"),
        ({"crosses": ((3, 3, 0.1),)}, r"`crosses` must be \(column a, column b != a"),
        ({"crosses": ((1, 2, -0.1),)}, r"`crosses` must be"),
        ({"numeric_effect_on_value": 1}, r"`numeric_effect_on_value` must be a bool"),
        ({"id_weight_tail_rank": 0}, r"`id_weight_tail_rank` must be an int in \[1, "),
        ({"id_weight_tail_rank": 2.5}, r"`id_weight_tail_rank` must be an int"),
        ({"id_weight_tail_power": 0.0}, r"`id_weight_tail_power` must be a float in \(0, 4\]"),
        ({"id_weight_tail_power": True}, r"`id_weight_tail_power` must be a float"),
        ({"cross_rank": 0}, r"`cross_rank` must be an int in \[1, 64\].*cross_rank=0"),
        ({"cross_rank": 65}, r"`cross_rank` must be an int in \[1, 64\]"),
        (
            {"rows_per_day": 100_000_000, "num_days": 50},
            r"ids must fit in 32 bits",
        ),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_bad_config_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        SyntheticConfig(**kwargs)


def test_existing_output_is_refused_unless_overwrite(tmp_path: Path) -> None:
    cfg = SyntheticConfig(rows_per_day=500, num_days=1, parts_per_day=2)
    generate(tmp_path, cfg)
    with pytest.raises(ArgumentError, match=r"already holds generated data .*overwrite=True"):
        generate(tmp_path, cfg)
    again = generate(tmp_path, SyntheticConfig(rows_per_day=500, num_days=1), overwrite=True)
    # The rerun has one part per day: no stale part-00001 is left behind.
    assert sorted(p.name for p in (tmp_path / "2024-05-10").iterdir()) == ["part-00000.parquet"]
    assert again.train_files["2024-05-10"] == (tmp_path / "2024-05-10" / "part-00000.parquet",)


def test_config_type_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="`config` must be a SyntheticConfig"):
        generate(tmp_path, {"rows_per_day": 10})  # type: ignore[arg-type]
