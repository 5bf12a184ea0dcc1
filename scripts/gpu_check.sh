#!/bin/bash
# The GPU check (docs/scale.md, "Checking a GPU machine") on a machine with CUDA torch but no network, from the
# bundle scripts/gpu_bundle.sh builds (it copies this script to .gpu/run.sh): run `bash .gpu/run.sh` in the repo's
# root there, with .gpu/ beside the code. The project's other packages come from .gpu/site.tar.xz (CPython 3.12),
# the tokenizer and squaddev from .gpu/cache.tar.xz. Reports go to $OUT (else ./gpu-check-out).
# GPU_CHECK_WORKERS (4): pytest-xdist workers, one `flwr run` each; GPU_CHECK_K: a pytest -k filter;
# GPU_CHECK_TIMEOUT (420 s).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
t0=$(date +%s)
mv .gpu /tmp/gpu  # flwr builds the app from this folder: keep the archives out of it
tar -xJf /tmp/gpu/site.tar.xz -C /tmp && mkdir -p /tmp/fpcache && tar -xJf /tmp/gpu/cache.tar.xz -C /tmp/fpcache
PY=$(command -v python3)
sed -i "1s|^#!.*python.*|#!$PY|" /tmp/gpusite/bin/*
export PYTHONPATH=$PWD:/tmp/gpusite PATH=/tmp/gpusite/bin:$PATH FEDPRUNE_CACHE=/tmp/fpcache/fedprune PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
{ nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv; nproc; uname -r
  python3 -c "import sys,torch,transformers,peft,flwr,ray,lm_eval,numpy; print(sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0), '| transformers', transformers.__version__, '| peft', peft.__version__, '| flwr', flwr.__version__, '| ray', ray.__version__, '| lm_eval', lm_eval.__version__ if hasattr(lm_eval,'__version__') else '?', '| numpy', numpy.__version__)"
  echo "setup: $(( $(date +%s) - t0 )) s"; } 2>&1 | tee $OUT/machine.txt
N=${GPU_CHECK_WORKERS:-4}
timeout ${GPU_CHECK_TIMEOUT:-420} python3 -m pytest -q -rs -m slow tests/cli/test_gpu_smoke.py -p no:cacheprovider \
  -n "$N" ${GPU_CHECK_K:+-k "$GPU_CHECK_K"} --durations=0 --junitxml=$OUT/junit.xml 2>&1 | tee $OUT/gpu-check.log
echo "rc ${PIPESTATUS[0]}; total: $(( $(date +%s) - t0 )) s" | tee -a $OUT/gpu-check.log
