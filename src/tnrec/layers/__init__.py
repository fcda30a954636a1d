"""Layers over the temporary embedding matrix."""

from tnrec.layers.embedding import EmbeddingFeatures

__all__ = ["EmbeddingFeatures"]
