"""Feature columns: column specs, the feature-spec format, hashing raw values to keys.

NumPy/Arrow only (no torch). See :mod:`tnrec.feature_column._hash` for the
exact, pinned key function.

Example:
    >>> import tnrec.feature_column as fc
    >>> user = fc.category_column("user_id", dtype="int")
    >>> emb = fc.embedding_column(user, dimension=8)
    >>> fc.from_spec(fc.to_spec([emb])) == [emb]
    True
"""

from tnrec.feature_column._hash import HASH_NAME, fnv1a64, name_hash
from tnrec.feature_column.arrow import (
    Bags,
    bucket_keys,
    categorical_bags,
    hash_values,
    numeric_values,
)
from tnrec.feature_column.columns import (
    Bucketize,
    BucketizedColumn,
    CategoricalColumn,
    CategoryColumn,
    Column,
    EmbeddingColumn,
    Log1p,
    NumericColumn,
    SequenceCategoryColumn,
    Standardize,
    Transform,
    bucketize,
    category_column,
    embedding_column,
    log1p,
    numeric_column,
    sequence_category_column,
    standardize,
)
from tnrec.feature_column.spec import (
    SPEC_FORMAT,
    SPEC_VERSION,
    canonical_spec,
    from_spec,
    to_spec,
)

__all__ = [
    "canonical_spec",
    "HASH_NAME",
    "SPEC_FORMAT",
    "SPEC_VERSION",
    "Bags",
    "BucketizedColumn",
    "Bucketize",
    "CategoricalColumn",
    "CategoryColumn",
    "Column",
    "EmbeddingColumn",
    "Log1p",
    "NumericColumn",
    "SequenceCategoryColumn",
    "Standardize",
    "Transform",
    "bucket_keys",
    "bucketize",
    "categorical_bags",
    "category_column",
    "embedding_column",
    "fnv1a64",
    "from_spec",
    "hash_values",
    "log1p",
    "name_hash",
    "numeric_column",
    "numeric_values",
    "sequence_category_column",
    "standardize",
    "to_spec",
]
