"""The feature-spec document: every column with all its settings, versioned JSON.

Checkpoints and exports store it, so a predictor hashes raw features exactly
as training did. Layout (format version 1)::

    {"format": "tnrec.feature_spec", "format_version": 1,
     "hash": "splitmix64-fnv1a64/1",
     "columns": [
       {"type": "category", "key": "user_id", "dtype": "int", "embedding_share": null},
       {"type": "sequence_category", "key": "clicks", "dtype": "str", "max_length": 50,
        "embedding_share": "item"},
       {"type": "numeric", "key": "I1", "default": 0.0,
        "transforms": [{"type": "log1p"}, {"type": "standardize", "mean": 1.0, "std": 2.0}]},
       {"type": "bucketized", "key": "age", "default": 0.0, "transforms": [],
        "boundaries": [18.0, 25.0]},
       {"type": "embedding", "dimension": 8, "combiner": "sum",
        "categorical": {"type": "category", ...}}]}

Format version 2 is version 1 plus ``"dtype": "sign"`` (values that are
64-bit keys already, never hashed). :func:`to_spec` writes version 2 exactly
when some column has that dtype, so a spec without one stays a version-1
document, and a reader that knows only version 1 refuses a sign column by its
version instead of hashing its values as ints. This reader reads both.

A reader refuses any other ``format``, ``format_version`` or ``hash``. Specs
written before the key was spelled ``format_version`` (``"version": 1``) read
the same; :func:`canonical_spec` gives either spelling one form to compare.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tnrec.errors import SpecError
from tnrec.feature_column._hash import HASH_NAME
from tnrec.feature_column.columns import (
    BucketizedColumn,
    CategoryColumn,
    Column,
    EmbeddingColumn,
    Log1p,
    NumericColumn,
    SequenceCategoryColumn,
    Standardize,
    bucketize,
    category_column,
    embedding_column,
    numeric_column,
    sequence_category_column,
    standardize,
)

SPEC_FORMAT = "tnrec.feature_spec"
SPEC_VERSION = 1
SIGN_SPEC_VERSION = 2  # the version of a spec with a dtype="sign" column
_READS = (SPEC_VERSION, SIGN_SPEC_VERSION)


def _transforms_to_json(transforms: Sequence[Log1p | Standardize]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in transforms:
        if isinstance(t, Log1p):
            out.append({"type": "log1p"})
        else:
            out.append({"type": "standardize", "mean": t.mean, "std": t.std})
    return out


def _column_to_json(col: Column) -> dict[str, Any]:
    if isinstance(col, CategoryColumn):
        return {
            "type": "category",
            "key": col.key,
            "dtype": col.dtype,
            "embedding_share": col.embedding_share,
        }
    if isinstance(col, SequenceCategoryColumn):
        return {
            "type": "sequence_category",
            "key": col.key,
            "dtype": col.dtype,
            "max_length": col.max_length,
            "embedding_share": col.embedding_share,
        }
    if isinstance(col, NumericColumn):
        return {
            "type": "numeric",
            "key": col.key,
            "default": col.default,
            "transforms": _transforms_to_json(col.transforms),
        }
    if isinstance(col, BucketizedColumn):
        return {
            "type": "bucketized",
            "key": col.key,
            "default": col.default,
            "transforms": _transforms_to_json(col.transforms),
            "boundaries": list(col.boundaries),
        }
    if isinstance(col, EmbeddingColumn):
        return {
            "type": "embedding",
            "dimension": col.dimension,
            "combiner": col.combiner,
            "categorical": _column_to_json(col.categorical),
        }
    raise SpecError(f"to_spec: not a feature column: {col!r}.")


def to_spec(columns: Sequence[Column]) -> dict[str, Any]:
    """Serialise columns to the versioned feature-spec document (a JSON-ready dict).

    Args:
        columns: feature columns, in order; keys must be unique.

    Returns:
        The document; ``json.dumps`` it to write it.

    Raises:
        SpecError: a column is not a feature column, or two columns share a key.
    """
    seen: set[str] = set()
    out = []
    for col in columns:
        doc = _column_to_json(col)
        if col.key in seen:
            raise SpecError(f'to_spec: two columns have the key "{col.key}"; keys must be unique.')
        seen.add(col.key)
        out.append(doc)
    signs = any(getattr(getattr(c, "categorical", c), "dtype", None) == "sign" for c in columns)
    return {
        "format": SPEC_FORMAT,
        "format_version": SIGN_SPEC_VERSION if signs else SPEC_VERSION,
        "hash": HASH_NAME,
        "columns": out,
    }


def canonical_spec(spec: Any) -> Any:
    """Return ``spec`` with its version under ``format_version`` (specs written with the key
    ``version`` compare equal to the same spec written now); anything else as it is."""
    if isinstance(spec, Mapping) and "version" in spec and "format_version" not in spec:
        out = {k: v for k, v in spec.items() if k != "version"}
        out["format_version"] = spec["version"]
        return out
    return spec


def _field(doc: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in doc:
        raise SpecError(f"feature spec: {where} has no field `{name}`.")
    return doc[name]


def _transforms_from_json(docs: Any, where: str) -> list[Any]:
    if not isinstance(docs, list):
        raise SpecError(f"feature spec: {where}: `transforms` must be a list.")
    out: list[Any] = []
    for d in docs:
        kind = d.get("type") if isinstance(d, Mapping) else None
        if kind == "log1p":
            out.append(Log1p())
        elif kind == "standardize":
            out.append(standardize(_field(d, "mean", where), _field(d, "std", where)))
        else:
            raise SpecError(f"feature spec: {where}: unknown transform {d!r}.")
    return out


def _column_from_json(doc: Any) -> Column:
    if not isinstance(doc, Mapping):
        raise SpecError(f"feature spec: a column must be an object. Received: {doc!r}.")
    kind = doc.get("type")
    where = f"column {doc.get('key', '?')!r}"
    if kind == "category":
        return category_column(
            _field(doc, "key", where),
            dtype=_field(doc, "dtype", where),
            embedding_share=doc.get("embedding_share"),
        )
    if kind == "sequence_category":
        return sequence_category_column(
            _field(doc, "key", where),
            _field(doc, "dtype", where),
            _field(doc, "max_length", where),
            embedding_share=doc.get("embedding_share"),
        )
    if kind == "numeric":
        trs = _transforms_from_json(_field(doc, "transforms", where), where)
        return numeric_column(_field(doc, "key", where), _field(doc, "default", where), trs)
    if kind == "bucketized":
        trs = _transforms_from_json(_field(doc, "transforms", where), where)
        trs.append(bucketize(_field(doc, "boundaries", where)))
        return numeric_column(_field(doc, "key", where), _field(doc, "default", where), trs)
    if kind == "embedding":
        cat = _column_from_json(_field(doc, "categorical", "embedding column"))
        if isinstance(cat, (NumericColumn, EmbeddingColumn)):
            raise SpecError("feature spec: an embedding column must wrap a categorical column.")
        return embedding_column(
            cat, _field(doc, "dimension", where), _field(doc, "combiner", where)
        )
    raise SpecError(f"feature spec: unknown column type {kind!r} in {doc!r}.")


def from_spec(spec: Mapping[str, Any] | str) -> list[Column]:
    """Rebuild the columns of a feature-spec document (dict or JSON text).

    Args:
        spec: what :func:`to_spec` returned, or its JSON text.

    Returns:
        The columns, equal to the ones given to :func:`to_spec`.

    Raises:
        SpecError: the document is not a feature spec, has another version or
            hash, or describes an invalid column.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpecError(f"feature spec: not valid JSON: {e}.") from e
    if not isinstance(spec, Mapping) or spec.get("format") != SPEC_FORMAT:
        got = spec.get("format") if isinstance(spec, Mapping) else type(spec).__name__
        raise SpecError(f"feature spec: `format` must be {SPEC_FORMAT!r}. Received: {got!r}.")
    doc: Mapping[str, Any] = canonical_spec(spec)
    if doc.get("format_version") not in _READS:
        raise SpecError(
            f"feature spec: unsupported `format_version` {doc.get('format_version')!r}; "
            f"this tnrec reads format versions {_READS[0]} and {_READS[1]}."
        )
    if doc.get("hash") != HASH_NAME:
        raise SpecError(
            f"feature spec: unsupported `hash` {doc.get('hash')!r}; "
            f"this tnrec hashes with {HASH_NAME!r}."
        )
    columns = _field(doc, "columns", "the document")
    if not isinstance(columns, list):
        raise SpecError("feature spec: `columns` must be a list.")
    return [_column_from_json(c) for c in columns]
