#!/usr/bin/env bash
# Install TorchRec (CPU) for bench/compare.py. Not a dependency of tnrec.
#
# The order and the pins matter (tested with torch 2.13.0 CPU):
#  * fbgemm-gpu-cpu 1.9.0 and 1.7.0 fail to load with torch 2.13.0;
#  * a plain `pip install torchrec` pulls a CUDA build of fbgemm, hence --no-deps;
#  * torchrec's remaining runtime imports are installed by hand afterwards.
set -euo pipefail
PY=${PYTHON:-python3}
"$PY" -m pip install torch==2.13.0 fbgemm-gpu-cpu==1.8.0
"$PY" -m pip install --no-deps torchrec==1.8.0
"$PY" -m pip install tensordict 'torchmetrics==1.0.3' tqdm pyre-extensions iopath
"$PY" -c "import torchrec, fbgemm_gpu; print('torchrec', torchrec.__version__, 'OK')"
