#!/bin/bash
# One-shot check of the GPU path on a CUDA machine (issues 37, 45), at most 9.5 minutes in all:
#   1. the environment: nvidia-smi, torch and nvImageCodec versions, `pixfeed doctor --json`   (~10 s)
#   2. the tests marked gpu (python -m pytest -m gpu), in the test files that hold them          (<= 150 s)
#   3. benchmarks/gpu_host.py: the device stage's host µs per image (CPU only, no GPU needed)     (<= 90 s)
#   4. benchmarks/gpu_feed.py on the carried photos, time-boxed to 5 minutes                      (<= 320 s)
# From the project root of a checkout with .device-carry/ beside it (see benchmarks/gpu_feed.py):
#   . .device-carry/env.sh && bash benchmarks/gpu_check.sh
# Results go to $OUT (where the device runner collects them) or else ./gpu-check/: environment.txt,
# doctor.json, pytest-gpu.log, pytest-gpu.xml, gpu_host.json, gpu_host.log, gpu_feed.json (rewritten after
# every row), gpu_feed.log.
# Every step runs whatever the one before gave; the exit status is the first failure's.
# IMAGES=DIR replaces .device-carry/img; FEED_ARGS="--seconds 4" adds arguments to gpu_feed.py.
set -u -o pipefail
RESULTS=${OUT:-gpu-check}
IMAGES=${IMAGES:-.device-carry/img}
mkdir -p "$RESULTS"
status=0
note() { echo "== $(date +%H:%M:%S) $*" | tee -a "$RESULTS/steps.txt"; }
keep() { [ "$status" -ne 0 ] || status=$1; }

note "environment"
{
  nvidia-smi || true
  nproc
  python - <<'EOF'
import importlib.metadata as m, torch
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("torchvision", "nvidia-nvimgcodec-cu12", "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "nvidia-nvjpeg-cu12",
             "simplejpeg", "webdataset", "lmdb"):
    print(name, v(name))
from pixfeed.image import gpu
print("pixfeed.image.gpu.available('cuda'):", gpu.available("cuda"))
EOF
} > "$RESULTS/environment.txt" 2>&1
keep $?
timeout 60 python -m pixfeed.cli doctor --json > "$RESULTS/doctor.json" 2>> "$RESULTS/environment.txt"
keep $?
cat "$RESULTS/environment.txt"

note "tests marked gpu"
files=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
if [ -n "$files" ]; then
  # addopts overridden: the doc-block plugin of the full suite is not needed (nor carried) for these files
  timeout 150 python -m pytest -q -m gpu -rs -o addopts="--strict-markers -p no:cacheprovider" \
    --junitxml "$RESULTS/pytest-gpu.xml" $files 2>&1 | tee "$RESULTS/pytest-gpu.log"
  keep $?
else
  echo "no test file holds a pytest.mark.gpu test" | tee "$RESULTS/pytest-gpu.log"
fi

note "benchmarks/gpu_host.py"
timeout 90 python benchmarks/gpu_host.py --images "$IMAGES" --batches 4 --out "$RESULTS/gpu_host.json" 2>&1 \
  | tee "$RESULTS/gpu_host.log"
keep $?

note "benchmarks/gpu_feed.py"
timeout 320 python benchmarks/gpu_feed.py --images "$IMAGES" --out "$RESULTS/gpu_feed.json" ${FEED_ARGS:-} 2>&1 \
  | tee "$RESULTS/gpu_feed.log"
keep $?

note "done, exit status $status; results in $RESULTS"
exit $status
