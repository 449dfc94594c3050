#!/usr/bin/env bash
# GPU box: issue 20's second check — after the first sitting (docs/benchmarks.md "Issue 20, agent-sized prompts").
# Two device calls, ~5 minutes of device time in all:
#   check (~3.5 min; timeouts total 6.5 min) llama.cpp's build starts in the background (it outlives the call on a
#         warm machine); ft bench e2e --prefill 8192,32768 --itl-prompt 32768 (hybrid, 12
#         layers, cache 0.25, 16 threads): TTFT cold and warm (+64 tokens: the warm row must now copy far less than the
#         pool — stream_min_tokens(128, 8) = 76 > 64), and 3 streams' ITL while a 32k prompt prefills (balanced chunks);
#         the same ITL row with the code before this branch (.carry/old-src.tgz, commit 8aa5d51: equal chunks) for the
#         A/B in one sitting; then ft bench http: 4 concurrent streaming clients through a real ft serve process on
#         loopback, 8k-token prompts, TTFT p50/p99.
#   peer  (~1.5 min) llama.cpp's prompt rate at 8k and 32k (llama-bench -p, all experts on the CPU, 16 threads) once
#         its build is done.
# Prepare .carry/ on the dev box (git-ignored), from the repository root:
#   mkdir -p .carry/wheels && cd .carry/wheels && for p in fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
#     pydantic==2.13.4 pydantic-core==2.46.4 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 httpx==0.28.1 httpcore==1.0.9 \
#     idna==3.20 certifi==2026.5.20 typing-extensions==4.16.0 typing-inspection==0.4.2 annotated-types==0.7.0 \
#     annotated-doc==0.0.7 opentelemetry-api==1.45.2 click==8.5.1 xxhash==4.1.0 rich psutil pyyaml markdown-it-py mdurl pygments; do
#     pip download --only-binary=:all: --platform manylinux_2_17_x86_64 --python-version 3.12 --no-deps -d . "$p"; done
#   pip download --only-binary=:all: --platform manylinux_2_31_x86_64 --python-version 3.12 --no-deps -d . \
#     llguidance==1.9.1; cd ../..                                                        # (~10 MB)
#   git archive 8aa5d51 src ':!src/freetoken/assets' | gzip > .carry/old-src.tgz        # the code before this branch
#   .carry/lcpp-src.tgz and .carry/baselines/ as bench/gpu/e2e.sh says (../shared/baselines/README.md)
# Run:  run(command="bash bench/gpu/prefill_check2.sh check", carry=[".carry"]) then the same with "peer".
# The wheels go to /tmp/ftdeps (after src on PYTHONPATH, before the box's site-packages).
set -uo pipefail
DEPS=/tmp/ftdeps
export PYTHONPATH=src:$DEPS PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25 --cpu-threads 16"
deps() {  # every carried wheel, so that fastapi and pydantic meet the versions they were resolved with
  mkdir -p "$DEPS"
  python3 -m pip install -q --no-deps --no-index --target "$DEPS" .carry/wheels/*.whl > "$OUT/deps.log" 2>&1 \
    || { echo "wheel install failed:"; tail -5 "$OUT/deps.log"; }
  python3 -c "import fastapi, uvicorn, httpx, llguidance, xxhash; print('server deps:', fastapi.__version__)" \
    || echo "server deps missing: the http stage will fail"
}
for stage in ${*:-check peer}; do case $stage in
check)
  if [ ! -x /tmp/lc/llama.cpp/build/bin/llama-bench ] && [ -f .carry/lcpp-src.tgz ]; then
    (setsid bash -c "mkdir -p /tmp/lc && tar xzf .carry/lcpp-src.tgz -C /tmp/lc && cd /tmp/lc/llama.cpp && \
      cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cmake.log 2>&1 && \
      nice cmake --build build --target llama-bench -j 8 > /tmp/lc/build.log 2>&1; echo done > /tmp/lc/built" \
      > /dev/null 2>&1 < /dev/null &)
  fi
  deps
  echo "== ft bench e2e --prefill (TTFT cold / warm +64, bytes; ITL beside a 32k prefill), this branch"
  timeout 150 $E2E --policies hybrid --no-decode --repeats 1 --prefill 8192,32768 --itl-prompt 32768 \
    --json "$OUT/ttft_hybrid.json" > "$OUT/ttft_hybrid.log" 2> "$OUT/ttft_hybrid.err"
  grep "^|" "$OUT/ttft_hybrid.log"; grep -iE "error|Traceback" -A3 "$OUT/ttft_hybrid.err" | head -8
  echo "== the same ITL row before this branch (8aa5d51: equal chunks)"
  rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && tar xzf .carry/old-src.tgz -C /tmp/oldsrc
  PYTHONPATH=/tmp/oldsrc/src:$DEPS timeout 90 $E2E --policies hybrid --no-decode --repeats 1 --itl-prompt 32768 \
    --json "$OUT/itl_old.json" > "$OUT/itl_old.log" 2> "$OUT/itl_old.err"
  grep "^|" "$OUT/itl_old.log" | tail -1; grep -iE "error|Traceback" -A3 "$OUT/itl_old.err" | head -8
  echo "== ft bench http: 4 streaming clients through ft serve on loopback, 8k-token prompts"
  timeout 150 python3 -m freetoken.bench.http_ttft --layers 12 --dir $CK --policy hybrid --expert-cache 0.25 \
    --cpu-threads 16 --clients 4 --prompt-tokens 8192 --rounds 3 --max-tokens 8 --server-log "$OUT/http_server.log" \
    --json "$OUT/http_ttft.json" > "$OUT/http_ttft.log" 2>&1
  grep "^|" "$OUT/http_ttft.log"; grep -iE "error|Traceback|failed" -A3 "$OUT/http_ttft.log" | head -8
  tail -5 "$OUT/http_server.log"
  echo "llama.cpp build: $(cat /tmp/lc/built 2>/dev/null || echo running)" ;;
peer)
  for i in $(seq 1 36); do [ -f /tmp/lc/built ] && break; sleep 5; done
  if [ -x /tmp/lc/llama.cpp/build/bin/llama-bench ]; then
    [ -f /tmp/m.gguf ] || PYTHONPATH=/tmp/lc/llama.cpp/gguf-py python3 .carry/baselines/make_gguf_qwen3moe.py /tmp/m.gguf 12 | tail -1
    for p in 8192 32768; do
      timeout 90 /tmp/lc/llama.cpp/build/bin/llama-bench -m /tmp/m.gguf -ngl 99 --n-cpu-moe 12 -t 16 -p $p -n 0 -r 1 \
        -o csv 2>/dev/null | tail -n 1 | awk -v p=$p -F, '{gsub(/"/,""); print "llama.cpp prompt " p ": " $(NF-1) " tok/s"}'
    done
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
