#!/usr/bin/env bash
# Everything this project checks on a CUDA machine, in one command (2.5 min on an H200):
# bench/gpu_check.py (CPU vs CUDA equivalence, W = 2, throughput), then the tests with
# CUDA branches. Runs from a checkout without installing it (the machine's torch, numpy,
# numba, pyarrow and xxhash are used as they are). Logs go to $OUT (default ./gpu_out).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/bench:$PWD PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/tnrec_numba_cache}
{ nvidia-smi -L; python3 -c "import sys, torch, numpy, numba, pyarrow
print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__,
      'numba', numba.__version__, 'pyarrow', pyarrow.__version__,
      'cuda', torch.cuda.is_available(), torch.cuda.device_count())"; } 2>&1 | tee "$OUT/env.log"
timeout "${CHECK_TIMEOUT:-300}" python3 bench/gpu_check.py --profile --batches 4096,16384,4096 2>&1 | tee "$OUT/gpu_check.log"
check=${PIPESTATUS[0]}
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -o addopts="" -q -ra \
  tests/unit/model/test_device.py tests/unit/layers/test_pooling_torch.py \
  tests/unit/serving/test_predictor_device.py tests/unit/cli/test_cli_device.py \
  tests/unit/layers/test_device_check.py tests/unit/ps/test_dense_backend.py \
  tests/unit/test_bench_gpu_check.py -k "not the_script_says" 2>&1 | tee "$OUT/pytest.log"
tests=${PIPESTATUS[0]}
echo "gpu_check exit $check, tests exit $tests"
[ "$check" = 0 ] && [ "$tests" = 0 ]
