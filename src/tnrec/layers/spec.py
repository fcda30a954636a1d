"""What a model's inputs are, read off its embedding layers, and the protocols of a model
that checkpoints and exports work against.

``checkpoint`` and ``export`` sit on the same layer as ``Model`` and are called by
it (``save_weights``, ``export``); they see a model only through the protocols
here, so neither imports ``Model``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch

from tnrec.feature_column import to_spec
from tnrec.layers.embedding import EmbeddingFeatures
from tnrec.ps import ParameterServer
from tnrec.table import SparseTable


class HasEmbeddingLayers(Protocol):
    """A model whose sparse inputs are read by :class:`EmbeddingFeatures` layers."""

    def embedding_layers(self) -> Sequence[EmbeddingFeatures]: ...


class CheckpointModel(HasEmbeddingLayers, Protocol):
    """What :mod:`tnrec.checkpoint` reads from and writes into a model."""

    optimizer: Any
    _ps: ParameterServer | None  # swapped back when a load fails half-way

    @property
    def tables(self) -> dict[str, SparseTable]: ...

    @property
    def ps(self) -> ParameterServer: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = ..., assign: bool = ...
    ) -> Any: ...

    def parameters(self, recurse: bool = ...) -> Iterator[torch.nn.Parameter]: ...

    def buffers(self, recurse: bool = ...) -> Iterator[torch.Tensor]: ...

    def build_tables(self) -> Any: ...


class ExportModel(HasEmbeddingLayers, Protocol):
    """What :mod:`tnrec.export` reads from a model: layers, tables, heads, the dense part."""

    training: bool
    global_step: int

    @property
    def tables(self) -> dict[str, SparseTable]: ...

    @property
    def ps(self) -> ParameterServer: ...

    @property
    def heads(self) -> Sequence[Any]: ...

    def forward_dense(self, pooled: Any, dense: torch.Tensor) -> Any: ...

    def train(self, mode: bool = ...) -> Any: ...

    def eval(self) -> Any: ...


def input_columns(model: HasEmbeddingLayers) -> list[Any]:
    """The model's input columns, one per key: its layers' categorical columns, then
    ``model.feature_columns`` (numeric columns and anything else it declares)."""
    cols: list[Any] = []
    for layer in model.embedding_layers():
        cols += [c.categorical for c in layer.columns]
    cols += list(getattr(model, "feature_columns", []) or [])
    unique: dict[str, Any] = {}
    for c in cols:
        c = getattr(c, "categorical", c)
        unique.setdefault(c.key, c)
    return list(unique.values())


def feature_spec(model: HasEmbeddingLayers) -> dict[str, Any]:
    """Return the feature spec of the model's inputs (:func:`input_columns`).

    The layers' embedding settings (dimension, combiner, table) are kept beside it
    by :func:`layers_spec`.
    """
    return to_spec(input_columns(model))


def layers_spec(model: HasEmbeddingLayers) -> dict[str, Any]:
    """Return each embedding layer's table and columns (key, dimension, combiner)."""
    return {
        layer.name or layer.table_name: {
            "table": layer.table_name,
            "columns": [[c.key, c.dimension, c.combiner] for c in layer.columns],
        }
        for layer in model.embedding_layers()
    }
