"""The model zoo: LR, WideDeep, DeepFM, DCN (v2), built from feature columns.

Every zoo model outputs a logit ``[B]`` and compiles by default with
``binary_crossentropy_from_logits`` (predictions are probabilities), its
constructor's dense optimizer, and the ``auc`` and ``logloss`` metrics.

Example:
    >>> import tempfile
    >>> import tnrec as tn
    >>> from tnrec.data.synthetic import SyntheticConfig, generate
    >>> from tnrec.models import DeepFM
    >>> root = generate(tempfile.mkdtemp(), SyntheticConfig(rows_per_day=200, num_days=1)).out_dir
    >>> model = DeepFM(tn.data.criteo_columns(), embedding_dim=16, hidden_units=[400, 400, 400])
    >>> model.compile()
    >>> data = tn.data.read_parquet(f"{root}/2024-*/*.parquet", tn.data.criteo_columns())
    >>> history = model.fit(data, verbose=0)
    >>> sorted(history.history)
    ['auc', 'logloss', 'loss']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tnrec.errors import ArgumentError
from tnrec.feature_column import Column
from tnrec.models.base import ZooModel
from tnrec.models.dcn import DCN, CrossLayer
from tnrec.models.deepfm import DeepFM
from tnrec.models.lr import LR
from tnrec.models.widedeep import WideDeep

#: zoo name -> class (the CLI's ``model.name``)
MODELS: dict[str, Callable[..., ZooModel]] = {m.zoo_name: m for m in (LR, WideDeep, DeepFM, DCN)}

__all__ = ["DCN", "LR", "MODELS", "CrossLayer", "DeepFM", "WideDeep", "ZooModel", "build"]


def build(name: str, columns: Sequence[Column], **params: Any) -> ZooModel:
    """Return the zoo model ``name`` (``lr``, ``widedeep``, ``deepfm``, ``dcn``) over ``columns``.

    Args:
        name: the model's zoo name (case-insensitive).
        columns: the feature columns.
        **params: the model's constructor arguments.

    Raises:
        ArgumentError: unknown name.
    """
    cls = MODELS.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ArgumentError(f"Unknown model {name!r}; expected one of {sorted(MODELS)}.")
    return cls(columns, **params)
