"""The ``tnrec`` command: ``demo``, ``train``, ``evaluate``, ``predict``, ``export``, ``inspect``.

::

    tnrec demo                                  # synthetic data -> DeepFM -> AUC vs optimal
    tnrec train --config run.toml [--eval-next-day]   # the days in order, a checkpoint per day
    tnrec evaluate --model-dir runs/deepfm/model       # the config's test data, or --data ...
    tnrec predict --model-dir runs/deepfm/model --output preds.parquet [--merge]
    tnrec export --model-dir runs/deepfm/model [--dt DT] --out export/ [--min-show X] [--onnx]
                 [--allow-incomplete]
    tnrec export --model-dir runs/deepfm/model --delta --since DT1 --to DT2 --out delta/
    tnrec inspect runs/deepfm/model[/DT] [--table T --key K] [--json]
    tnrec checkpoint publish runs/deepfm/model/DT/GEN   # restore a lost _checkpoint, roll back
    torchrun --nproc-per-node 2 -m tnrec.cli train --config run.toml
    torchrun --nproc-per-node 2 -m tnrec.cli export --model-dir runs/deepfm/model --out export/

The model dir is a checkpoint root (:mod:`tnrec.checkpoint`) plus ``model.json``
(:mod:`tnrec.cli.artifacts`), from which the zoo model is rebuilt. The run
configuration (TOML) is described in :mod:`tnrec.cli.config`; every error
names the key and the file. ``train``, ``evaluate``, ``predict`` and
``export`` run on every worker a launcher starts (``torchrun``); only rank 0
prints and writes shared files (``export``: each worker writes its own
dictionary shards).

Every JSON the command prints or appends to the run log is strict JSON: a
non-finite number (an AUC of data with one label is NaN) is written as
``null``. Exit status: 0 on success; 2 for a user error (one line
``tnrec <command>: error: ...`` on stderr, naming the key, flag, file or
path); 1 for an operating-system error (a full disk, a permission), with the
path.

The package: :mod:`~tnrec.cli.entry` (the parser), :mod:`~tnrec.cli.train`,
:mod:`~tnrec.cli.run` (evaluate, predict, export), :mod:`~tnrec.cli.demo`,
:mod:`~tnrec.cli.inspection`, and the application files they read and write:
:mod:`~tnrec.cli.config` (the run config), :mod:`~tnrec.cli.inputs` (its
input files and readers) and :mod:`~tnrec.cli.artifacts` (``model.json``).
"""

from tnrec.cli.demo import demo
from tnrec.cli.entry import main
from tnrec.cli.inspection import inspect
from tnrec.cli.run import evaluate, export, predict
from tnrec.cli.train import train

__all__ = ["demo", "evaluate", "export", "inspect", "main", "predict", "train"]
