"""import_checkpoint / tnrec import-tensornet: TensorNet's sparse files as a tnrec checkpoint."""

import gzip
import os

import numpy as np
import pytest
import torch

import tnrec as tn
import tnrec.compat.tensornet as tnc
from tnrec.cli.entry import main
from tnrec.compat.tensornet_import import import_checkpoint
from tnrec.errors import ArgumentError, CheckpointError
from tnrec.table import SparseTable

from .tensornet_writer import block_bytes, make_rows, txt_value, write_checkpoint

D = 3


def imported_rows(report, name):
    part = os.path.join(report.path, "sparse", name, "part-00000-of-00001")
    return SparseTable.load(part).rows()


def expected(rows, mode):
    """The fields a tnrec table should hold, sorted by key (the sign's int64 bits)."""
    keys = rows.signs.view(np.int64)
    order = np.argsort(keys, kind="stable")
    v = np.vectorize(txt_value, otypes=[np.float32]) if mode == "txt" else (lambda x: x)
    out = {"keys": keys[order], "weights": v(rows.w[order]), "show": v(rows.show[order])}
    if rows.optimizer == "AdaGrad":
        out["g2sum"] = v(rows.a[order])
    else:
        a, b = ("m", "v") if rows.optimizer == "Adam" else ("z", "n")
        out[a], out[b] = v(rows.a[order]), v(rows.b[order])
    return out, order


CASES = [
    pytest.param("AdaGrad", "txt", False, id="adagrad-txt"),
    pytest.param("AdaGrad", "txt", True, id="adagrad-txt-cvm"),
    pytest.param("AdaGrad", "bin", False, id="adagrad-bin"),
    pytest.param("AdaGrad", "bin", True, id="adagrad-bin-cvm"),
    pytest.param("Adam", "txt", False, id="adam-txt"),
    pytest.param("Adam", "bin", False, id="adam-bin"),
    pytest.param("Ftrl", "txt", False, id="ftrl-txt"),
    pytest.param("Ftrl", "bin", False, id="ftrl-bin"),
]


@pytest.mark.parametrize(("opt", "mode", "cvm"), CASES)
def test_import_reads_back_every_field(tmp_path, opt, mode, cvm):
    rows = make_rows(opt, 60, D, seed=1)
    write_checkpoint(str(tmp_path / "tn"), "20240510", {"user": rows}, mode=mode, cvm=cvm, ranks=3)
    report = import_checkpoint(
        str(tmp_path / "tn"), str(tmp_path / "out"), optimizer=opt if mode == "bin" else None,
        cvm=cvm,
    )  # fmt: skip
    assert report.dt == "20240510"
    assert report.tables["user"] == {
        "optimizer": opt, "dim": D, "rows": rows.signs.shape[0], "files": 24, "ranks": 3,
    }  # fmt: skip
    got = imported_rows(report, "user")
    want, order = expected(rows, mode)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    adagrad = opt == "AdaGrad"
    np.testing.assert_array_equal(got["unseen_days"], rows.no_show_days[order] if adagrad else 0)
    v = np.vectorize(txt_value, otypes=[np.float32]) if mode == "txt" else (lambda x: x)
    np.testing.assert_array_equal(got["click"], v(rows.click[order]) if adagrad and cvm else 0)
    if opt == "Adam":
        np.testing.assert_array_equal(got["step"], 0)
    assert any("dense table" in line for line in report.not_imported)
    assert any("TF checkpoint" in line for line in report.not_imported)


def test_txt_is_six_digits_and_bin_exact(tmp_path):
    rows = make_rows("AdaGrad", 20, D, seed=2)
    rows.w[0, 0] = np.float32(0.1234567)
    write_checkpoint(str(tmp_path / "t"), "d", {"e": rows}, mode="txt", ranks=1)
    write_checkpoint(str(tmp_path / "b"), "d", {"e": rows}, mode="bin", ranks=1)
    t = imported_rows(import_checkpoint(str(tmp_path / "t"), str(tmp_path / "ot")), "e")
    b = imported_rows(
        import_checkpoint(str(tmp_path / "b"), str(tmp_path / "ob"), optimizer="AdaGrad"), "e"
    )
    key = rows.signs[:1].view(np.int64)[0]
    assert t["weights"][t["keys"] == key][0, 0] == np.float32(0.123457)
    assert b["weights"][b["keys"] == key][0, 0] == np.float32(0.1234567)


def test_several_tables_and_old_adagrad_layout(tmp_path):
    a = make_rows("AdaGrad", 10, D, seed=3)
    f = make_rows("Ftrl", 10, 2, seed=4)
    root = str(tmp_path / "tn")
    write_checkpoint(root, "d", {"deep": a, "wide": f}, ranks=2, dense=False)
    # the older AdaGrad layout: sign, dim, w, g2sum, show (no no_show_days)
    path = os.path.join(root, "d", "sparse_table", "deep", "rank_0", "block_0.gz")
    lines = gzip.decompress(open(path, "rb").read()).decode().split("\n")[2:]
    old = "opt_name:AdaGrad\ndim:3\n4\t3\t1\t2\t3\t0.5\t7\t\n"  # sign 4: rank 0, block 0
    old += "".join(_old(ln) + "\n" for ln in lines if ln)
    open(path, "wb").write(gzip.compress(old.encode()))
    report = import_checkpoint(root, str(tmp_path / "out"))
    assert sorted(report.tables) == ["deep", "wide"] and report.not_imported == []
    got = imported_rows(report, "deep")
    row = got["keys"] == 4
    np.testing.assert_array_equal(got["weights"][row], [[1, 2, 3]])
    assert got["g2sum"][row] == 0.5 and got["show"][row] == 7 and got["unseen_days"][row] == 0
    assert len(got["keys"]) == 11
    np.testing.assert_array_equal(
        imported_rows(report, "wide")["keys"], np.sort(f.signs.view(np.int64))
    )


def _old(line):
    """A current AdaGrad line without its no_show_days cell (the older layout)."""
    cells = line.rstrip("\t").split("\t")
    return "\t".join(cells[:-1]) + "\t"


class SignModel(tn.Model):
    def __init__(self):
        super().__init__()
        col = tnc.category_column("sid")
        self.emb = tnc.EmbeddingFeatures(
            [tn.feature_column.embedding_column(col, D, combiner="sum")],
            tnc.AdaGrad(learning_rate=0.01),
            name="user",
            is_concat=True,
        )
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward_dense(self, pooled, dense):
        return pooled["user"].sum(1, keepdim=True) + self.bias  # [B, 1]: the weights' sum


def test_a_model_pulls_the_imported_weights_for_those_signs(tmp_path):
    rows = make_rows("AdaGrad", 30, D, seed=5)
    write_checkpoint(str(tmp_path / "tn"), "d", {"user": rows}, mode="bin", ranks=2)
    import_checkpoint(str(tmp_path / "tn"), str(tmp_path / "out"), optimizer="AdaGrad")
    torch.manual_seed(0)
    m = SignModel()
    m.compile(tn.optimizer.Adam(learning_rate=0.01), loss="mse")
    report = m.load_weights(str(tmp_path / "out"), partial=True)
    assert "table user" in report.loaded
    signs = [int(s) for s in rows.signs[:8]] + [5]
    batch = tn.data.to_batch({"sid": signs}, [tnc.category_column("sid")])
    got = m.predict_step(batch)[""]  # the one head
    want = rows.w[:8].astype(np.float64).sum(1)
    np.testing.assert_allclose(got[:8], want, rtol=1e-6)
    assert 5 not in rows.signs  # an unseen sign reads its initial vector
    init = m.tables["user"].initial_vectors(np.array([5], np.int64))  # [1, D]
    np.testing.assert_allclose(got[8], init.astype(np.float64).sum(), rtol=1e-6)


# ---------------------------------------------------------------- malformed files


def _one_block(tmp_path, data, name="block_0.gz"):
    root = tmp_path / "tn"
    rank = root / "d" / "sparse_table" / "t" / "rank_0"
    rank.mkdir(parents=True)
    (root / "_checkpoint").write_text('{"dt": "d"}')
    (rank / name).write_bytes(gzip.compress(data))
    return str(root), str(rank / name)


def test_truncated_bin_names_file_and_offset(tmp_path):
    rows = make_rows("AdaGrad", 5, D, seed=6)
    data = block_bytes(rows, range(5), "bin", False)[:-7]  # cut into the last record
    root, fname = _one_block(tmp_path, data)
    rec = 8 + 4 * D + 12
    with pytest.raises(
        CheckpointError,
        match=rf"{fname}: truncated at byte offset {4 + 4 * rec}: sign 4 needs {rec} bytes",
    ):
        import_checkpoint(root, str(tmp_path / "out"), optimizer="AdaGrad")


def test_wrong_cell_count_names_file_and_line(tmp_path):
    rows = make_rows("AdaGrad", 4, D, seed=7)
    lines = block_bytes(rows, range(4), "txt", False).decode().split("\n")
    lines[3] = lines[3].rsplit("\t", 2)[0]  # line 4 loses its no_show_days cell... and more
    lines[3] = "\t".join(lines[3].split("\t")[:-2])
    root, fname = _one_block(tmp_path, "\n".join(lines).encode())
    with pytest.raises(
        CheckpointError,
        match=rf"{fname}: line 4: {D + 2} tab-separated cells; a AdaGrad line of dim {D} has",
    ):
        import_checkpoint(root, str(tmp_path / "out"))


@pytest.mark.parametrize(
    ("data", "kw", "match"),
    [
        pytest.param(b"opt_name:Sgd\ndim:2\n", {}, r"unknown optimizer 'Sgd' \(line 1\)", id="opt"),
        pytest.param(b"\x02\0\0\0\n", {}, r"a bin file does not name its optimizer", id="bin"),
        pytest.param(
            b"\x02\0\0\0\n", {"optimizer": "Sgd"}, r"unknown optimizer 'Sgd' \(optimizer=\)",
            id="bin-opt",
        ),
        pytest.param(
            b"opt_name:Adam\ndim:x\n", {}, r"line 2: dim must be a positive int", id="dim"
        ),
        pytest.param(
            b"opt_name:Ftrl\ndim:1\n5\t0.1\t0.2\tabc\t1\n", {},
            r"line 3, cell 4: 'abc' is not a number", id="cell",
        ),
        pytest.param(
            b"opt_name:Ftrl\ndim:1\n-5\t0.1\t0.2\t0.3\t1\n", {},
            r"line 3, cell 1: '-5' is not an unsigned 64-bit sign", id="sign",
        ),
        pytest.param(
            b"opt_name:AdaGrad\ndim:1\n5\t2\t0.1\t0.2\t1\t0\t\n", {},
            r"line 3, cell 2: dim 2 != the header's dim 1", id="line-dim",
        ),
        pytest.param(b"\x00\x00", {"optimizer": "Adam"}, r"truncated at byte 0", id="short"),
    ],
)  # fmt: skip
def test_malformed_blocks_name_the_file(tmp_path, data, kw, match):
    root, fname = _one_block(tmp_path, data)
    with pytest.raises(CheckpointError, match=rf"TensorNet block {fname}: .*{match}"):
        import_checkpoint(root, str(tmp_path / "out"), **kw)


def test_damaged_gzip_and_txt_optimizer_mismatch(tmp_path):
    root, fname = _one_block(tmp_path, b"opt_name:Adam\ndim:1\n")
    raw = open(fname, "rb").read()
    with pytest.raises(CheckpointError, match=r"line 1: the file's optimizer is Adam, expected"):
        import_checkpoint(root, str(tmp_path / "o1"), optimizer="Ftrl")
    open(fname, "wb").write(raw[:12])
    with pytest.raises(CheckpointError, match=rf"TensorNet block {fname}: damaged gzip stream"):
        import_checkpoint(root, str(tmp_path / "o2"))


def test_a_sign_in_two_blocks_and_disagreeing_dims(tmp_path):
    rows = make_rows("Adam", 6, D, seed=8)
    root = str(tmp_path / "tn")
    write_checkpoint(root, "d", {"t": rows}, ranks=1, dense=False)
    rank = os.path.join(root, "d", "sparse_table", "t", "rank_0")
    dup = os.path.join(root, "d", "sparse_table", "t", "rank_1")
    os.makedirs(dup)
    open(os.path.join(dup, "block_0.gz"), "wb").write(
        gzip.compress(block_bytes(rows, [0], "txt", False))
    )
    with pytest.raises(CheckpointError, match=rf'table "t": sign {int(rows.signs[0])} is in'):
        import_checkpoint(root, str(tmp_path / "o1"))
    other = make_rows("Adam", 5, D + 1, seed=9)
    open(os.path.join(dup, "block_0.gz"), "wb").write(
        gzip.compress(block_bytes(other, [0], "txt", False))
    )
    with pytest.raises(CheckpointError, match=r"Adam dim 4, but .*rank_0.* is Adam dim 3"):
        import_checkpoint(root, str(tmp_path / "o2"))
    assert os.path.isdir(rank)


def test_arguments_and_sources(tmp_path):
    with pytest.raises(CheckpointError, match=r"neither a _checkpoint file nor a sparse_table"):
        import_checkpoint(str(tmp_path), str(tmp_path / "out"))
    rows = make_rows("Ftrl", 4, D, seed=10)
    root = str(tmp_path / "tn")
    write_checkpoint(root, "d", {"t": rows}, ranks=1)
    with pytest.raises(ArgumentError, match=r'table "t": its files hold Ftrl state; the settings'):
        import_checkpoint(root, str(tmp_path / "o"), settings=tnc.AdaGrad())
    # a sparse_table directory works as the source, and dst must be new
    report = import_checkpoint(os.path.join(root, "d", "sparse_table"), str(tmp_path / "o"))
    assert report.dt == "d"
    with pytest.raises(ArgumentError, match=r"already holds a tnrec checkpoint"):
        import_checkpoint(root, str(tmp_path / "o"))


def test_cli_import_tensornet(tmp_path, capsys):
    rows = make_rows("Ftrl", 12, D, seed=11)
    write_checkpoint(str(tmp_path / "tn"), "d", {"t": rows}, mode="bin", ranks=2)
    args = ["import-tensornet", str(tmp_path / "tn"), str(tmp_path / "out"), "--optimizer", "Ftrl"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f'table "t": {rows.signs.shape[0]} rows' in out and "not imported" in out
    got = imported_rows(import_checkpoint(
        str(tmp_path / "tn"), str(tmp_path / "out2"), optimizer="Ftrl"), "t")  # fmt: skip
    assert len(got["keys"]) == rows.signs.shape[0]
    assert main(["import-tensornet", str(tmp_path / "tn"), str(tmp_path / "o3")]) == 2
    assert "does not name its optimizer" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "gz"),
    [
        pytest.param("sparse_block_0_bin.gz", True, id="suffixed"),
        pytest.param("block_0.gz", False, id="not-gzipped"),
    ],
)
def test_other_block_names_and_plain_files(tmp_path, name, gz):
    rows = make_rows("Adam", 5, D, seed=12)
    data = block_bytes(rows, range(rows.signs.shape[0]), "bin", False)
    root = tmp_path / "tn"
    rank = root / "d" / "sparse_table" / "t" / "rank_0"
    rank.mkdir(parents=True)
    (root / "_checkpoint").write_text('{"dt": "d"}')
    (rank / name).write_bytes(gzip.compress(data) if gz else data)
    (rank / "notes.txt").write_text("not a block")  # ignored: not a block file name
    got = imported_rows(import_checkpoint(str(root), str(tmp_path / "o"), optimizer="Adam"), "t")
    want, _ = expected(rows, "bin")
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
