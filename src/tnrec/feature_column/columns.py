"""Feature column specs: what a raw field is and how it becomes keys or floats.

Columns are frozen dataclasses built through the functions below, which
validate their arguments. They carry no state and no vocabulary: a categorical
value is hashed to a 64-bit key (see :mod:`tnrec.feature_column._hash`), or,
for ``dtype="sign"``, is a 64-bit key already.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from tnrec.errors import SpecError

DTYPES = ("int", "str", "sign")
Dtype = Literal["int", "str", "sign"]
COMBINERS = ("sum", "mean", "sqrtn")


def _check_key(kind: str, key: object) -> str:
    if not isinstance(key, str) or not key:
        raise SpecError(f"{kind}: `key` must be a non-empty str. Received: key={key!r}.")
    return key


def _check_dtype(key: str, dtype: object) -> Dtype:
    if dtype not in DTYPES:
        raise SpecError(
            f'Column "{key}": `dtype` must be one of {DTYPES}. Received: dtype={dtype!r}.'
        )
    return dtype  # type: ignore[return-value]


def _check_share(key: str, share: object) -> str | None:
    if share is not None and (not isinstance(share, str) or not share):
        raise SpecError(
            f'Column "{key}": `embedding_share` must be None or a non-empty str. '
            f"Received: embedding_share={share!r}."
        )
    return share


def _check_pos_int(key: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise SpecError(
            f'Column "{key}": `{name}` must be a positive int. Received: {name}={value!r}.'
        )
    return int(value)


def _check_finite(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise SpecError(f"{where}: `{name}` must be a finite number. Received: {name}={value!r}.")
    out = float(value)
    if not math.isfinite(out):
        raise SpecError(f"{where}: `{name}` must be a finite number. Received: {name}={value!r}.")
    return out


# --------------------------------------------------------------------------- categorical


@dataclass(frozen=True)
class CategoryColumn:
    """A sparse feature: one or many values per row, each hashed to a key.

    With ``dtype="sign"`` the values are 64-bit feature signs used as keys
    unhashed (see :func:`category_column`).

    Example:
        >>> user = category_column("user_id", dtype="int")
        >>> user.identity
        'user_id'
    """

    key: str
    dtype: Dtype = "int"
    embedding_share: str | None = None

    @property
    def identity(self) -> str:
        """The name mixed into every key: the share group, else the column key."""
        return self.embedding_share or self.key

    @property
    def max_length(self) -> int:
        """How many values a row keeps (0: all)."""
        return 0


@dataclass(frozen=True)
class SequenceCategoryColumn:
    """An ordered list of values per row (oldest first); keeps the last ``max_length``.

    Example:
        >>> clicks = sequence_category_column("clicked_items", dtype="str", max_length=50)
    """

    key: str
    dtype: Dtype
    max_length: int
    embedding_share: str | None = None

    @property
    def identity(self) -> str:
        """The name mixed into every key: the share group, else the column key."""
        return self.embedding_share or self.key


# --------------------------------------------------------------------------- numeric


@dataclass(frozen=True)
class Log1p:
    """``sign(x) * log(1 + |x|)``: finite for negative counts (Criteo's I2 has -1)."""

    def apply(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Return the transformed copy of ``x``."""
        return np.sign(x) * np.log1p(np.abs(x))


@dataclass(frozen=True)
class Standardize:
    """``(x - mean) / std``."""

    mean: float
    std: float

    def apply(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Return the transformed copy of ``x``."""
        return (x - self.mean) / self.std


@dataclass(frozen=True)
class Bucketize:
    """Bucket index ``i`` such that ``boundaries[i-1] <= x < boundaries[i]`` (0..len)."""

    boundaries: tuple[float, ...]

    def bucket(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """Return ``int64[B]`` bucket indices; NaN falls in the last bucket."""
        return np.searchsorted(np.asarray(self.boundaries), x, side="right").astype(np.int64)


Transform = Log1p | Standardize | Bucketize


def log1p() -> Log1p:
    """Return the signed ``log1p`` transform (``numeric_column(..., transform=log1p())``)."""
    return Log1p()


def standardize(mean: float, std: float) -> Standardize:
    """Return the transform ``(x - mean) / std``.

    Raises:
        SpecError: ``mean`` is not finite or ``std`` is not a finite positive number.
    """
    m = _check_finite("standardize", "mean", mean)
    s = _check_finite("standardize", "std", std)
    if s <= 0:
        raise SpecError(f"standardize: `std` must be > 0. Received: std={std!r}.")
    return Standardize(mean=m, std=s)


def bucketize(boundaries: Sequence[float]) -> Bucketize:
    """Return the transform that turns a numeric column into a categorical one.

    Raises:
        SpecError: ``boundaries`` is empty, not finite or not strictly increasing.
    """
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise SpecError(
            f"bucketize: `boundaries` must be a sequence of numbers. "
            f"Received: boundaries={boundaries!r}."
        )
    b = tuple(_check_finite("bucketize", "boundaries[i]", v) for v in boundaries)
    if not b or any(b[i] >= b[i + 1] for i in range(len(b) - 1)):
        raise SpecError(
            "bucketize: `boundaries` must be a non-empty, strictly increasing sequence. "
            f"Received: boundaries={list(boundaries)!r}."
        )
    return Bucketize(boundaries=b)


@dataclass(frozen=True)
class NumericColumn:
    """A dense float feature: ``default`` when missing, then ``transforms`` in order.

    Example:
        >>> i1 = numeric_column("I1", default=0.0, transform=log1p())
    """

    key: str
    default: float = 0.0
    transforms: tuple[Log1p | Standardize, ...] = ()

    def apply(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Return ``x`` (defaults already filled) through every transform."""
        for t in self.transforms:
            x = t.apply(x)
        return x


@dataclass(frozen=True)
class BucketizedColumn:
    """A numeric field made categorical: its bucket index is hashed like an int value.

    Example:
        >>> age = numeric_column("age", transform=bucketize([18, 25, 35, 50]))
        >>> age.dtype
        'int'
    """

    key: str
    default: float
    transforms: tuple[Log1p | Standardize, ...]
    boundaries: tuple[float, ...]

    @property
    def dtype(self) -> Literal["int"]:
        """Bucket indices are ints."""
        return "int"

    @property
    def identity(self) -> str:
        """The name mixed into every key (the column key)."""
        return self.key

    @property
    def embedding_share(self) -> None:
        """Bucketized columns never share keys."""
        return None

    @property
    def max_length(self) -> int:
        """One key per row."""
        return 1

    def bucket(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        """Return ``int64[B]`` bucket indices of ``x`` (defaults already filled)."""
        for t in self.transforms:
            x = t.apply(x)
        return Bucketize(self.boundaries).bucket(x)


CategoricalColumn = CategoryColumn | SequenceCategoryColumn | BucketizedColumn


@dataclass(frozen=True)
class EmbeddingColumn:
    """A categorical column with the dimension and combiner of its embedding.

    The table is chosen by the layer (``EmbeddingFeatures``), not here.

    Example:
        >>> emb = embedding_column(category_column("user_id"), dimension=8, combiner="mean")
        >>> emb.key
        'user_id'
    """

    categorical: CategoricalColumn
    dimension: int
    combiner: Literal["sum", "mean", "sqrtn"] = "sum"

    @property
    def key(self) -> str:
        """The key of the wrapped categorical column."""
        return self.categorical.key


Column = (
    CategoryColumn | SequenceCategoryColumn | BucketizedColumn | NumericColumn | EmbeddingColumn
)


# --------------------------------------------------------------------------- constructors


def category_column(
    key: str, *, dtype: Dtype = "int", embedding_share: str | None = None
) -> CategoryColumn:
    """Declare a sparse feature with no vocabulary and no bucket count.

    Args:
        key: the field name in the input.
        dtype: canonical form every reader converts a value to before hashing:
            ``"int"`` (int64; text ``"123"`` and ``"123.0"`` are 123) or ``"str"``
            (UTF-8 bytes; null and empty strings are missing), or ``"sign"``:
            the values already are 64-bit feature signs (TensorNet's, or any
            system's) and the key is the sign's 64 bits, unhashed: int64 as it
            is, uint64 (including values >= 2**63) reinterpreted as the same
            bits, text a decimal int64 or uint64 (no fraction, no exponent).
            Floats are refused (a sign above 2**53 does not survive one). The
            column's name is not part of a sign's key, so two sign columns
            holding the same sign share one row of a table they share, as in
            TensorNet; put the slot into the sign when they must not.
        embedding_share: group name; columns of one group hash equal values to
            equal keys (the group name replaces the key in the hash). For
            ``dtype="sign"`` it changes no key.

    Returns:
        The column spec.

    Raises:
        SpecError: an argument is invalid.
    """
    k = _check_key("category_column", key)
    return CategoryColumn(k, _check_dtype(k, dtype), _check_share(k, embedding_share))


def sequence_category_column(
    key: str,
    dtype: Dtype = "int",
    max_length: int = 50,
    *,
    embedding_share: str | None = None,
) -> SequenceCategoryColumn:
    """Declare an ordered list feature (clicked items, query terms).

    Lists are read oldest first; a longer list keeps its last ``max_length``
    present values.

    Args:
        key: the field name in the input.
        dtype: ``"int"``, ``"str"`` or ``"sign"``, as in :func:`category_column`.
        max_length: most values kept per row.
        embedding_share: as in :func:`category_column`.

    Returns:
        The column spec.

    Raises:
        SpecError: an argument is invalid.
    """
    k = _check_key("sequence_category_column", key)
    return SequenceCategoryColumn(
        k,
        _check_dtype(k, dtype),
        _check_pos_int(k, "max_length", max_length),
        _check_share(k, embedding_share),
    )


def embedding_column(
    categorical: CategoricalColumn,
    dimension: int,
    combiner: Literal["sum", "mean", "sqrtn"] = "sum",
) -> EmbeddingColumn:
    """Attach an embedding dimension and a bag combiner to a categorical column.

    Args:
        categorical: a category, sequence or bucketized column.
        dimension: embedding width D.
        combiner: how a row's embeddings are pooled: ``"sum"``, ``"mean"`` or ``"sqrtn"``.

    Returns:
        The column spec.

    Raises:
        SpecError: an argument is invalid.
    """
    if not isinstance(categorical, (CategoryColumn, SequenceCategoryColumn, BucketizedColumn)):
        raise SpecError(
            "embedding_column: `categorical` must be a category, sequence or bucketized "
            f"column. Received: categorical={categorical!r}."
        )
    key = categorical.key
    dim = _check_pos_int(key, "dimension", dimension)
    if combiner not in COMBINERS:
        raise SpecError(
            f'Column "{key}": `combiner` must be one of {COMBINERS}. '
            f"Received: combiner={combiner!r}."
        )
    return EmbeddingColumn(categorical, dim, combiner)


def numeric_column(
    key: str,
    default: float = 0.0,
    transform: Transform | Sequence[Transform] | None = None,
) -> NumericColumn | BucketizedColumn:
    """Declare a dense float feature.

    Args:
        key: the field name in the input.
        default: the value used when the field is missing (null, empty or NaN).
        transform: one transform or several applied in order: :func:`log1p`,
            :func:`standardize`, :func:`bucketize`. A final ``bucketize`` makes the
            column categorical (its bucket index is hashed like an int value).

    Returns:
        A :class:`NumericColumn`, or a :class:`BucketizedColumn` when the last
        transform is ``bucketize``.

    Raises:
        SpecError: an argument is invalid, or ``bucketize`` is not last.
    """
    k = _check_key("numeric_column", key)
    d = _check_finite(f'Column "{k}"', "default", default)
    if transform is None:
        chain: list[object] = []
    elif isinstance(transform, Sequence) and not isinstance(transform, (str, bytes)):
        chain = list(transform)
    else:
        chain = [transform]
    chain = [Log1p() if t is log1p else t for t in chain]  # accept `transform=log1p`
    for i, t in enumerate(chain):
        if not isinstance(t, (Log1p, Standardize, Bucketize)):
            raise SpecError(
                f'Column "{k}": `transform` must be log1p(), standardize(...) or '
                f"bucketize(...). Received: transform={t!r}."
            )
        if isinstance(t, Bucketize) and i != len(chain) - 1:
            raise SpecError(f'Column "{k}": bucketize(...) must be the last transform.')
    if chain and isinstance(chain[-1], Bucketize):
        head = tuple(chain[:-1])
        return BucketizedColumn(k, d, head, chain[-1].boundaries)  # type: ignore[arg-type]
    return NumericColumn(k, d, tuple(chain))  # type: ignore[arg-type]
