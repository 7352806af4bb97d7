#!/bin/bash
# Issue 41's run on the lent GPU machine, as one command from the repository root (the
# device tool's `command`: `bash bench/gpu_run.sh`, carry [".whl"], timeout_s 590): the
# carried wheels (submitit, the one package jaxwarm needs that the device image lacks) into
# $SITE, then bench.gpu_check's checks in priority order, its JSON (written after each
# check) and its log under $OUT. --stop-after-s starts no check past 450 s, so the run ends
# inside the command's 600 s. Extra arguments go to gpu_check: on CPU,
#   PYTHON=.venv/bin/python SITE=/tmp/x-site OUT=/tmp/x-out bash bench/gpu_run.sh --dry-run
# runs the same checks at their smallest (docs/gpu.md).
set -o pipefail
: "${OUT:?set OUT, the dir for the JSON and the log}"
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl || exit
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
"${PYTHON:-python3}" -m bench.gpu_check \
    --only parallel,mock8,pgle,load_profile,shared_group,mock \
    --repeat 2 --layers 64 --stop-after-s 450 --json "$OUT/gpu_check.json" "$@" \
    2>&1 | tee "$OUT/gpu_check.log"
