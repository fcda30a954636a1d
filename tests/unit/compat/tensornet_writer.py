"""A writer of TensorNet checkpoints, byte for byte as the reference describes them.

``/work/shared/reference/tensornet.md`` §5.1-5.2: ``<root>/_checkpoint``
(``{"dt": ...}``), ``<root>/<dt>/sparse_table/<table>/rank_<r>/block_<0..7>.gz``
(gzip'd, 8 per rank, ``sign % ranks`` picks the rank), txt mode with
``opt_name:``/``dim:`` headers, C++ iostream floats (6 significant digits, what
``%g`` prints), AdaGrad's trailing tab without CVM, and bin mode (packed
little-endian records, a trailing newline byte) saved under the same
``block_<i>.gz`` names as txt (TensorNet's quirk). Written with plain loops:
it is the independent reference the importer is checked against.
"""

import gzip
import json
import os
import struct
from dataclasses import dataclass

import numpy as np


@dataclass
class Rows:
    """What TensorNet holds for one table: signs (uint64) and every field."""

    optimizer: str
    signs: np.ndarray  # [n] uint64
    w: np.ndarray  # [n, d] float32
    a: np.ndarray  # AdaGrad: g2sum [n]; Adam: m [n, d]; Ftrl: z [n, d]
    b: np.ndarray | None  # Adam: v; Ftrl: n; AdaGrad: None
    show: np.ndarray  # [n] float32
    click: np.ndarray  # [n] float32 (AdaGrad with CVM)
    no_show_days: np.ndarray  # [n] int32 (AdaGrad)


def make_rows(optimizer, n, dim, seed):
    rng = np.random.default_rng(seed)
    signs = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    signs[:3] = [2**64 - 1, 2**63, 2**63 + 12345]
    signs = np.unique(signs)
    n = signs.shape[0]
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    if optimizer == "AdaGrad":
        a, b = np.abs(f(n)), None
    else:
        a, b = f(n, dim), np.abs(f(n, dim))
    return Rows(
        optimizer,
        signs,
        f(n, dim),
        a,
        b,
        np.abs(f(n)) * 10,
        np.abs(f(n)),
        rng.integers(0, 40, n).astype(np.int32),
    )


def _g(x):
    """A float as C++'s default ostream prints it (6 significant digits)."""
    return f"{float(x):g}"  # printf's %g: C++'s default float output


def txt_line(rows, i, cvm):
    d = rows.w.shape[1]
    if rows.optimizer == "AdaGrad":
        out = f"{int(rows.signs[i])}\t{d}\t"
        out += "".join(_g(x) + "\t" for x in rows.w[i])
        out += f"{_g(rows.a[i])}\t{_g(rows.show[i])}\t{int(rows.no_show_days[i])}\t"
        if cvm:
            out += _g(rows.click[i])
        return out + "\n"
    out = str(int(rows.signs[i]))
    for j in range(d):
        out += f"\t{_g(rows.w[i, j])}\t{_g(rows.a[i, j])}\t{_g(rows.b[i, j])}"
    return out + f"\t{_g(rows.show[i])}\n"


def bin_record(rows, i, cvm):
    out = struct.pack("<Q", int(rows.signs[i]))
    out += b"".join(struct.pack("<f", x) for x in rows.w[i])
    if rows.optimizer == "AdaGrad":
        out += struct.pack("<ffi", rows.a[i], rows.show[i], rows.no_show_days[i])
        if cvm:
            out += struct.pack("<f", rows.click[i])
        return out
    for arr in (rows.a, rows.b):
        out += b"".join(struct.pack("<f", x) for x in arr[i])
    return out + struct.pack("<f", rows.show[i])


def block_bytes(rows, idx, mode, cvm):
    d = rows.w.shape[1]
    if mode == "txt":
        text = f"opt_name:{rows.optimizer}\ndim:{d}\n"
        return (text + "".join(txt_line(rows, i, cvm) for i in idx)).encode()
    return struct.pack("<i", d) + b"".join(bin_record(rows, i, cvm) for i in idx) + b"\n"


def write_checkpoint(root, dt, tables, *, mode="txt", cvm=False, ranks=2, dense=True):
    """Write ``tables`` ({name: Rows}) as TensorNet's ``save_weights(root, dt, mode)`` does."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "_checkpoint"), "w") as f:
        json.dump({"dt": dt}, f)
    for name, rows in tables.items():
        for r in range(ranks):
            rank_dir = os.path.join(root, dt, "sparse_table", name, f"rank_{r}")
            os.makedirs(rank_dir)
            mine = [i for i in range(rows.signs.shape[0]) if int(rows.signs[i]) % ranks == r]
            for b in range(8):
                idx = [i for i in mine if (int(rows.signs[i]) // ranks) % 8 == b]
                with open(os.path.join(rank_dir, f"block_{b}.gz"), "wb") as f:
                    f.write(gzip.compress(block_bytes(rows, idx, mode, cvm)))
    if dense:
        os.makedirs(os.path.join(root, dt, "dense_table", "0"))
        with open(os.path.join(root, dt, "dense_table", "0", "0"), "w") as f:
            f.write("total_elements:3\nrank_num:1\n")
        with open(os.path.join(root, dt, "tf_checkpoint.index"), "wb") as f:
            f.write(b"\0")


def txt_value(x):
    """What a txt file gives back for float32 ``x``: its 6-digit text, to float32."""
    return np.float32(float(_g(x)))
