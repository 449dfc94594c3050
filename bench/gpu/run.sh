#!/usr/bin/env bash
# The GPU box's one runner: `bash bench/gpu/run.sh STAGE [ARG]`, from the repository root, one device call a stage,
# every log whole under $OUT, a short table last. Carry [".whl"]: the wheels this script installs (the server's and
# the SDKs' dependencies, transformers 5.23, fla-core; how to fetch them: `bash bench/gpu/run.sh wheels` on the dev
# box). The box's python3 has torch, triton, numpy, safetensors, tokenizers, hypothesis, pytest-xdist.
#
# Stages:
#   tests SHARD   the test suite on the box, one shard a call (each well inside 10 minutes):
#                   gpu1, gpu2   the gpu-marked tests (CUDA), the test files split in two halves by name
#                   cpu          every other test, on the box's 16 cores (pytest-xdist), server and SDK tests included
#                 What cannot run there, and nowhere else skipped: the Chromium chat-page test (no browser on the
#                 box) and the npm/PyPI agent clients (tests/clients: no registry there).
#   graphs        the step graph for every batch bucket x sampler feature set: eager fallbacks and replays
#   wheels        (dev box, not the device) download the wheels into .whl/ for the box's Python 3.12
set -uo pipefail
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Not on the box: a browser, and the agent clients' registries.
NOT_HERE=(--ignore=tests/test_chat_page_browser.py --ignore=tests/clients)
WHEELS=(fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 h11==0.16.0 anyio==4.16.0 idna==3.21 pydantic==2.14.4
  pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  opentelemetry-api==1.45.3 openai==3.63.0 anthropic==2.17.0 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5
  jiter==0.19.0 sniffio==1.3.1 distro==1.9.0 docstring_parser==0.18.0 llguidance==1.9.1 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 transformers==5.23.0
  regex==2026.12.2 fla-core==0.6.0)

install_wheels() {
  [ -d .whl ] || { echo "no .whl/: run 'bash bench/gpu/run.sh wheels' on the dev box and carry .whl"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 2; }
  export PYTHONPATH=src:/tmp/site
}

gpu_files() {  # $1: 1 or 2 (one half of the files holding gpu-marked tests, alternating by name), or "all"
  python3 -m pytest -q -p no:cacheprovider --collect-only -m gpu "${NOT_HERE[@]}" tests 2>/dev/null |
    grep "::" | cut -d: -f1 | sort -u | awk -v h="$1" 'h == "all" || NR % 2 == h % 2'
}

summary() {  # $1: log
  local line; line=$(grep -E "^=+ .*(passed|failed|error).* =+$|^[0-9]+ (passed|failed)" "$1" | tail -1)
  echo "${line:-no summary (see $1)}"; grep -E "^(FAILED|ERROR) " "$1" | head -40
}

stage=${1:-}; shift || true
case $stage in
tests)
  install_wheels
  shard=${1:?"tests SHARD: gpu1, gpu2, gpu (both) or cpu"}
  # SIGINT at the limit: pytest stops and still prints its summary (failures, durations); -n: the box's 16 cores
  # compile the Triton kernels in parallel (the GPU tests are tiny models; one GPU serves every worker)
  P=(timeout -s INT 480 python3 -m pytest -q -p no:cacheprovider -rfEs --durations=40 --timeout=300)
  case $shard in
  gpu|gpu1|gpu2) h=${shard#gpu}; mapfile -t files < <(gpu_files "${h:-all}")
             "${P[@]}" -n "${GPU_WORKERS:-8}" -m gpu "${files[@]}" > "$OUT/tests_$shard.log" 2>&1 ;;
  cpu)       "${P[@]}" -n 14 -m "not gpu" "${NOT_HERE[@]}" tests > "$OUT/tests_$shard.log" 2>&1 ;;
  *) echo "unknown shard $shard (gpu1, gpu2, cpu)"; exit 2 ;;
  esac
  echo "rc $? shard $shard: $(summary "$OUT/tests_$shard.log")" ;;
graphs)
  install_wheels
  timeout 300 python3 bench/gpu/graph_matrix.py > "$OUT/graphs.log" 2>&1; echo "rc $?"; tail -30 "$OUT/graphs.log" ;;
wheels)
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_31_x86_64 -d .whl "${WHEELS[@]}" && du -sh .whl ;;
*) echo "usage: bash bench/gpu/run.sh tests gpu1|gpu2|cpu | graphs | wheels"; exit 2 ;;
esac
