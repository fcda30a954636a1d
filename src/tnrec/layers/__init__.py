"""Layers over the temporary embedding matrix, and the dense layers the model feeds."""

from tnrec.layers.embedding import EmbeddingFeatures
from tnrec.layers.normalization import BatchNormalization, PCTRBatchNormalization
from tnrec.layers.position import PositionBias

__all__ = ["BatchNormalization", "EmbeddingFeatures", "PCTRBatchNormalization", "PositionBias"]
