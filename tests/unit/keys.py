"""The int64 extremes every key-handling test feeds through (keys are any 64-bit value).

Python ints, so that they also bound hypothesis strategies and never wrap in
arithmetic such as ``INT64_MAX - 1``.
"""

import numpy as np

INT64_MIN = int(np.iinfo(np.int64).min)
INT64_MAX = int(np.iinfo(np.int64).max)
