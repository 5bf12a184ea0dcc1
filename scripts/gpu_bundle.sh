#!/usr/bin/env bash
# Build .gpu/, what scripts/gpu_check.sh needs on a GPU machine that has CUDA torch but no network (this workplace's
# device machines: Python 3.12, torch 2.11+cu130, no flwr, Ray or lm-eval):
#   .gpu/site.tar.xz   the project's other packages at .venv's versions, CPython 3.12 manylinux wheels unpacked
#                      into one folder (gpusite/), Ray without its Java jars, dashboard client, RLlib/Serve/Tune/Train/
#                      Data/LLM and lm-eval without its task folders (the project registers its own tasks), to fit the
#                      64 MiB a device call may carry;
#   .gpu/cache.tar.xz  the embedded tokenizer (no weights: the check uses the tests' tiny model) and squaddev.
# Run after `make setup`; ~3 min. The wheels come from the package index that pip uses here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-3.12}
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The packages the device image lacks (its list: the device library's KINDS.md) or holds at other versions
# (transformers & co.), at .venv's versions; torch, numpy, pandas, pyarrow and the rest stay the device's.
CARRY="flwr ray lm_eval datasets evaluate transformers peft tokenizers accelerate safetensors filelock grpcio
grpcio-health-checking protobuf alembic annotated-types cffi chardet cryptography DataProperty defusedxml dill fastapi
greenlet iterators jsonschema jsonschema-specifications Mako mbstrdecoder more-itertools multiprocess nltk
pathvalidate prompt_toolkit pycparser pycryptodome pydantic pydantic_core pytablewriter pytz referencing rouge_score
rpds-py SQLAlchemy sqlitedict starlette tabledata tcolorpy tomli tomli_w typepy typing-inspection uvicorn wcwidth
word2number"
.venv/bin/python -m pip list --format=freeze 2>/dev/null > "$WORK/all.txt"
for name in $CARRY; do
    grep -iE "^${name//[-_]/[-_]}==" "$WORK/all.txt" || { echo "[gpu-bundle] $name is not in .venv" >&2; exit 1; }
done > "$WORK/carry.txt"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
mkdir -p "$WORK/wheels" "$WORK/gpusite"
while read -r req; do
    if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
            $PLATFORMS -d "$WORK/wheels" "$req" 2>/dev/null; then
        name=${req%%==*}  # no 3.12 wheel (an sdist-only, pure-Python package): copy it from .venv
        for p in "$SITE/$name" "$SITE/${name//-/_}" "$SITE/${name//-/_}.py" "$SITE"/"${name//-/_}"-*.dist-info \
                 "$SITE"/"$name"-*.dist-info; do
            [ -e "$p" ] && cp -r "$p" "$WORK/gpusite/"
        done
        echo "[gpu-bundle] $req: copied from .venv (no CPython $PY wheel)"
    fi
done < "$WORK/carry.txt"
python3 -m pip install -q --no-deps --no-compile --target "$WORK/gpusite" --python-version "$PY" --implementation cp \
    $PLATFORMS --only-binary=:all: "$WORK"/wheels/*.whl
cd "$WORK/gpusite"
rm -rf ray/jars ray/rllib ray/serve ray/tune ray/train ray/data ray/llm ray/dashboard/client/build
find lm_eval/tasks -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
find . -name __pycache__ -type d -prune -exec rm -rf {} +
cd - >/dev/null
mkdir -p .gpu
tar -cf - -C "$WORK" gpusite | xz -T0 -6 > .gpu/site.tar.xz
CACHE=$(.venv/bin/python -c "from fedprune_app.llm.assets import cache_root; print(cache_root())")
M=models/smollm2-135m-instruct S=bigbench/_default/squad_shifts
mkdir -p "$WORK/cache/fedprune/$M" "$WORK/cache/fedprune/$S"
cp "$CACHE/$M"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,config.json,generation_config.json} \
   "$WORK/cache/fedprune/$M/"
cp "$CACHE/$S/squaddev_v1.1.json" "$WORK/cache/fedprune/$S/"
tar -cf - -C "$WORK/cache" fedprune | xz -T0 -6 > .gpu/cache.tar.xz
cp scripts/gpu_check.sh .gpu/run.sh
du -sh .gpu/*
