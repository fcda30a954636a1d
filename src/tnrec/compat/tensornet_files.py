"""Reading TensorNet's sparse block files: ``sparse_table/<table>/rank_<r>/block_<i>.gz``.

One block file holds some of one table's signs, with their weights and the
optimizer's state, in one of two modes (TensorNet's ``save_weights(mode=)``):

``txt``::

    opt_name:AdaGrad
    dim:<d>
    sign \\t dim \\t w_0 .. w_{d-1} \\t g2sum \\t show \\t no_show_days \\t [click]
    (AdaGrad: a trailing tab without CVM; the older layout without
     no_show_days has d+4 cells)
    sign \\t w_0 \\t m_0 \\t v_0 \\t w_1 ... \\t show          (Adam, interleaved)
    sign \\t w_0 \\t z_0 \\t n_0 \\t w_1 ... \\t show          (Ftrl, interleaved)

``bin`` (native little-endian, packed)::

    int32 dim, then per sign: uint64 sign, then
      AdaGrad: float32 w[d], g2sum, show, int32 no_show_days[, float32 click (CVM)]
      Adam:    float32 w[d], m[d], v[d], show
      Ftrl:    float32 w[d], z[d], n[d], show
    then one trailing newline byte.

The mode is read from the content, not the name: TensorNet names its bin
saves ``block_<i>.gz`` like txt ones (and then reloads them as txt). A bin
file names neither its optimizer nor CVM, so those come from the caller.
Files are gzip'd when they start with gzip's magic bytes, read whole otherwise.
txt floats carry TensorNet's 6 significant digits; they are read to the
nearest float32.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tnrec import _fileio
from tnrec.errors import CheckpointError

OPTIMIZERS = ("AdaGrad", "Adam", "Ftrl")
BLOCK_NAME = re.compile(r"^(block_|sparse_block_)(\d+)(_bin|_txt)?\.gz$")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class Block:
    """The rows of one block file, as TensorNet holds them.

    ``state`` is AdaGrad's ``g2sum`` ``[n]``, or Adam's ``m``/``v`` and FTRL's
    ``z``/``n`` ``[n, d]``. Adam and FTRL files hold no click nor unseen days
    (zeros here).
    """

    optimizer: str
    dim: int
    signs: npt.NDArray[np.uint64]  # [n]
    weights: npt.NDArray[np.float32]  # [n, d]
    state: dict[str, npt.NDArray[np.float32]]
    show: npt.NDArray[np.float32]  # [n]
    click: npt.NDArray[np.float32]  # [n]
    unseen_days: npt.NDArray[np.int32]  # [n]


def read_bytes(fname: str) -> bytes:
    """Return a block file's bytes, gunzipped when they are gzip's.

    Raises:
        CheckpointError: the file cannot be read or its gzip stream is damaged.
    """
    raw = _fileio.read_bytes(fname)
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise CheckpointError(f"TensorNet block {fname}: damaged gzip stream: {e}.") from None


def read_block(fname: str, optimizer: str | None = None, cvm: bool = False) -> Block:
    """Read one block file in either mode (see the module docstring).

    Args:
        fname: the file.
        optimizer: ``"AdaGrad"``, ``"Adam"`` or ``"Ftrl"``: required for a bin
            file; for a txt file, if given, it must be the file's.
        cvm: a bin AdaGrad file carries a click per sign (TensorNet's CVM).

    Returns:
        The block.

    Raises:
        CheckpointError: a damaged or truncated file, a line with the wrong
            number of cells, an unknown optimizer; the message names the file
            and the line or byte offset.
    """
    data = read_bytes(fname)
    if data.startswith(b"opt_name:"):
        return _read_txt(fname, data, optimizer)
    if optimizer is None:
        raise CheckpointError(
            f"TensorNet block {fname}: a bin file does not name its optimizer; pass "
            f"optimizer= one of {OPTIMIZERS}."
        )
    _check_optimizer(fname, optimizer, "optimizer=")
    return _read_bin(fname, data, optimizer, cvm)


def _check_optimizer(fname: str, name: str, where: str) -> None:
    if name not in OPTIMIZERS:
        raise CheckpointError(
            f"TensorNet block {fname}: unknown optimizer {name!r} ({where}); "
            f"expected one of {OPTIMIZERS}."
        )


# ---------------------------------------------------------------- bin


def _bin_record(optimizer: str, dim: int, cvm: bool) -> np.dtype:
    """The packed record of one sign in a bin file."""
    fields: list[tuple[str, str] | tuple[str, str, tuple[int]]] = [
        ("sign", "<u8"),
        ("w", "<f4", (dim,)),
    ]
    if optimizer == "AdaGrad":
        fields += [("g2sum", "<f4"), ("show", "<f4"), ("unseen", "<i4")]
        if cvm:
            fields.append(("click", "<f4"))
    else:
        a, b = ("m", "v") if optimizer == "Adam" else ("z", "n")
        fields += [(a, "<f4", (dim,)), (b, "<f4", (dim,)), ("show", "<f4")]
    return np.dtype(fields)  # type: ignore[arg-type]


def _read_bin(fname: str, data: bytes, optimizer: str, cvm: bool) -> Block:
    if len(data) < 4:
        raise CheckpointError(
            f"TensorNet block {fname}: truncated at byte 0: a bin file starts with an int32 "
            f"dim; the file has {len(data)} bytes."
        )
    dim = int(np.frombuffer(data, "<i4", 1)[0])
    if dim < 1:
        raise CheckpointError(f"TensorNet block {fname}: offset 0: dim must be >= 1, got {dim}.")
    rec = _bin_record(optimizer, dim, cvm)
    body = len(data) - 4
    if body % rec.itemsize == 1 and data[-1:] == b"\n":
        body -= 1  # TensorNet's trailing newline byte
    n, rest = divmod(body, rec.itemsize)
    if rest:
        at = 4 + n * rec.itemsize
        raise CheckpointError(
            f"TensorNet block {fname}: truncated at byte offset {at}: sign {n} needs "
            f"{rec.itemsize} bytes ({optimizer}, dim {dim}{', CVM' if cvm else ''}), "
            f"{rest} remain."
        )
    r = np.frombuffer(data, rec, n, offset=4)
    zeros = np.zeros(n, np.float32)
    if optimizer == "AdaGrad":
        state = {"g2sum": r["g2sum"].copy()}
        click = r["click"].copy() if cvm else zeros
        unseen = r["unseen"].astype(np.int32)
    else:
        names = ("m", "v") if optimizer == "Adam" else ("z", "n")
        state = {k: np.ascontiguousarray(r[k]) for k in names}
        click, unseen = zeros, np.zeros(n, np.int32)
    return Block(
        optimizer, dim, r["sign"].copy(), np.ascontiguousarray(r["w"]), state,
        r["show"].copy(), click, unseen,
    )  # fmt: skip


# ---------------------------------------------------------------- txt


def _header(fname: str, lines: list[str]) -> tuple[str, int]:
    """The optimizer and dim of a txt file's two header lines."""
    if len(lines) < 2 or not lines[1].startswith("dim:"):
        raise CheckpointError(f"TensorNet block {fname}: line 2: expected 'dim:<d>'.")
    name = lines[0][len("opt_name:") :]
    _check_optimizer(fname, name, "line 1")
    try:
        dim = int(lines[1][len("dim:") :])
    except ValueError:
        dim = 0
    if dim < 1:
        raise CheckpointError(
            f"TensorNet block {fname}: line 2: dim must be a positive int. Received: {lines[1]!r}."
        )
    return name, dim


def _cell_counts(optimizer: str, dim: int) -> dict[int, str]:
    """Number of cells of a data line (a trailing tab dropped) -> the layout it is."""
    if optimizer == "AdaGrad":
        return {dim + 5: "adagrad", dim + 6: "adagrad-cvm", dim + 4: "adagrad-old"}
    return {3 * dim + 2: optimizer.lower()}


def _read_txt(fname: str, data: bytes, optimizer: str | None) -> Block:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"TensorNet block {fname}: not text: {e}.") from None
    lines = text.split("\n")
    name, dim = _header(fname, lines)
    if optimizer is not None and optimizer != name:
        raise CheckpointError(
            f"TensorNet block {fname}: line 1: the file's optimizer is {name}, expected "
            f"{optimizer}."
        )
    if lines[-1] == "":
        lines.pop()  # the last line's newline
    body = np.char.rstrip(np.array(lines[2:], dtype=str), "\t")  # [n]: trailing tabs off
    layouts = _cell_counts(name, dim)
    counts = np.char.count(body, "\t") + 1  # [n]
    first = int(counts[0]) if body.shape[0] else next(iter(layouts))
    wrong = np.flatnonzero(counts != first)
    if first not in layouts or wrong.shape[0]:
        at = 0 if first not in layouts else int(wrong[0])
        raise CheckpointError(
            f"TensorNet block {fname}: line {at + 3}: {int(counts[at])} tab-separated cells; "
            f"a {name} line of dim {dim} has {' or '.join(map(str, layouts))}."
        )
    joined = "\t".join(body.tolist()).split("\t") if body.shape[0] else []
    cells = np.array(joined, dtype=str).reshape(body.shape[0], first)  # [n, C]
    return _txt_block(fname, name, dim, layouts[first], cells)


def _parse(fname: str, cells: np.ndarray, col: int, dtype: type, what: str) -> np.ndarray:
    """One column of cells as ``dtype``; a bad cell raises naming its line."""
    try:
        return cells.astype(dtype)
    except (ValueError, OverflowError):
        for i, row in enumerate(cells.reshape(cells.shape[0], -1)):
            for j, v in enumerate(row):
                try:
                    np.array([v]).astype(dtype)
                except (ValueError, OverflowError):
                    raise CheckpointError(
                        f"TensorNet block {fname}: line {i + 3}, cell {col + j + 1}: "
                        f"{str(v)!r} is not {what}."
                    ) from None
        raise


def _txt_block(fname: str, name: str, dim: int, layout: str, cells: np.ndarray) -> Block:
    n = cells.shape[0]
    signs = _parse(fname, cells[:, 0], 0, np.uint64, "an unsigned 64-bit sign")
    zeros = np.zeros(n, np.float32)
    if not layout.startswith("adagrad"):
        floats = _parse(fname, cells[:, 1:], 1, np.float64, "a number").astype(np.float32)
        tri = floats[:, : 3 * dim].reshape(n, dim, 3)  # [n, d, (w, m|z, v|n)]
        names = ("m", "v") if name == "Adam" else ("z", "n")
        state = {names[0]: tri[:, :, 1].copy(), names[1]: tri[:, :, 2].copy()}
        return Block(
            name, dim, signs, tri[:, :, 0].copy(), state, floats[:, 3 * dim].copy(),
            zeros, np.zeros(n, np.int32),
        )  # fmt: skip
    dims = _parse(fname, cells[:, 1], 1, np.int64, "an int")
    bad = np.flatnonzero(dims != dim)
    if bad.shape[0]:
        raise CheckpointError(
            f"TensorNet block {fname}: line {int(bad[0]) + 3}, cell 2: dim {int(dims[bad[0]])} "
            f"!= the header's dim {dim}."
        )
    floats = _parse(fname, cells[:, 2 : dim + 4], 2, np.float64, "a number").astype(np.float32)
    unseen = np.zeros(n, np.int32)
    click = zeros
    if layout != "adagrad-old":
        unseen = _parse(fname, cells[:, dim + 4], dim + 4, np.int32, "an int")
    if layout == "adagrad-cvm":
        click = _parse(fname, cells[:, dim + 5], dim + 5, np.float64, "a number").astype(np.float32)
    state = {"g2sum": floats[:, dim].copy()}
    return Block(
        name, dim, signs, floats[:, :dim].copy(), state, floats[:, dim + 1].copy(), click, unseen
    )
