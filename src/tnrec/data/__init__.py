"""Data: readers from raw files to hashed batches (NumPy/Arrow only, no torch).

Readers for Parquet, CSV/TSV with a schema, the raw Criteo format and TFRecord
files of ``tf.train.Example`` records all yield the same :class:`Batch`; they
split across workers, shuffle deterministically, read ahead in a background
thread and resume from a JSON-ready position.

Example:
    >>> import tempfile
    >>> import tnrec as tn
    >>> from tnrec.data.synthetic import SyntheticConfig, generate
    >>> root = tempfile.mkdtemp()      # data_dir/<day>/part-*.parquet, Criteo's columns
    >>> _ = generate(root, SyntheticConfig(rows_per_day=200, num_days=1, parts_per_day=2))
    >>> files = tn.data.list_files(root, days=["2024-05-10"], pattern="*.parquet")
    >>> reader = tn.data.read_parquet(files, tn.data.criteo_columns(), batch_size=64)
    >>> rank, world_size = 0, 2        # this worker of two; a launched job reads them
    >>> for batch in reader.split(rank, world_size):   # worker 0 reads one file of two
    ...     batch.keys("C1").shape, batch.offsets("C1").shape, batch.dense.shape, batch.labels.shape
    ((64,), (65,), (64, 13), (64, 1))
    ((36,), (37,), (36, 13), (36, 1))
"""

from tnrec.data.batch import Batch, Jagged
from tnrec.data.decode import Schema, make_schema, to_batch
from tnrec.data.files import Unit, expand_paths, list_files
from tnrec.data.reader import (
    POSITION_VERSION,
    PREFETCH_BATCHES,
    Reader,
    ReaderStats,
    prefetch_depth,
)
from tnrec.data.readers import (
    CRITEO_CATEGORICAL,
    CRITEO_FIELDS,
    CRITEO_LABEL,
    CRITEO_NUMERIC,
    criteo_columns,
    read_criteo,
    read_csv,
    read_parquet,
    read_tfrecord,
)
from tnrec.data.sources import ROW_BITS

__all__ = [
    "CRITEO_CATEGORICAL",
    "CRITEO_FIELDS",
    "CRITEO_LABEL",
    "CRITEO_NUMERIC",
    "POSITION_VERSION",
    "PREFETCH_BATCHES",
    "ROW_BITS",
    "Batch",
    "Jagged",
    "Reader",
    "ReaderStats",
    "Schema",
    "Unit",
    "criteo_columns",
    "expand_paths",
    "list_files",
    "make_schema",
    "prefetch_depth",
    "read_criteo",
    "read_csv",
    "read_parquet",
    "read_tfrecord",
    "to_batch",
]
