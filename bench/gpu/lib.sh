# Shared pieces of bench/gpu/run.sh (sourced): the carried wheels, pytest summaries, the synthetic checkpoints'
# commands, and the llama.cpp peer (built in the background from .carry/lcpp-src.tgz; the build outlives the device
# call on a warm machine).

# The carried wheels (.whl/, made by `bash bench/gpu/run.sh wheels` on the dev box) for the box's Python 3.12: the
# server's and the SDKs' dependencies, transformers 5.23 (the tests' oracle), fla-core + einops (the DeltaNet prefill
# kernels), accelerate (transformers' fp8 loading), xxhash (FTW), nvidia-ml-py (the VRAM watcher), huggingface_hub 2.4
# + click (the box's own huggingface_hub is older than pyproject's bound; the hub tests need ours; hf-xet, optional to
# it, stays home: working tree + carry must fit the device tool's 64 MiB).
WHEELS=(fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 h11==0.16.0 anyio==4.16.0 idna==3.21 pydantic==2.14.4
  pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
  opentelemetry-api==1.45.3 openai==3.63.0 anthropic==2.17.0 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5
  jiter==0.19.0 sniffio==1.3.1 distro==1.9.0 docstring_parser==0.18.0 llguidance==1.9.1 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 transformers==5.23.0
  regex==2026.12.2 fla-core==0.6.0 einops==0.8.2 accelerate==1.15.0 xxhash==4.1.0 nvidia-ml-py==13.615.71
  huggingface_hub==2.4.0 click==8.5.1)

# The SDKs (the server tests' clients) in .whl-sdk/: .whl + .carry/lcpp-src.tgz + the tree must fit the device
# tool's 64 MiB, .whl + .whl-sdk too; the llama.cpp stages need no SDK (carry .whl and .carry), the tests do (carry
# .whl and .whl-sdk)
SDK_WHEELS=(openai anthropic)

download_wheels() {  # on the dev box (it reaches the registry; the box does not)
  mkdir -p .whl .whl-sdk
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_31_x86_64 -d .whl "${WHEELS[@]}" || return
  local p; for p in "${SDK_WHEELS[@]}"; do mv .whl/"$p"-*.whl .whl-sdk/; done
  du -sh .whl .whl-sdk
}

install_wheels() {  # into /tmp/site, after src and tests on PYTHONPATH (tests: the helpers graph_matrix.py imports);
  # absolute, so test processes started in another directory find them too
  [ -d .whl ] || { echo "no .whl/: run 'bash bench/gpu/run.sh wheels' on the dev box and carry .whl"; exit 2; }
  local sdk=(); compgen -G ".whl-sdk/*.whl" > /dev/null && sdk=(.whl-sdk/*.whl)  # the SDKs, when carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    "${sdk[@]}" > "$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 2; }
  export PYTHONPATH=$PWD/src:$PWD/tests:/tmp/site
}

summary() {  # $1: a pytest log -> its last summary line and the failures
  local line; line=$(grep -E "^=+ .*(passed|failed|error).* =+$|^[0-9]+ (passed|failed)" "$1" | tail -1)
  echo "${line:-no summary (see $1)}"; grep -E "^(FAILED|ERROR) " "$1" | head -40
}

run_logged() {  # $1: limit s, $2: log name under $OUT (.log, .err), the rest: the command; errors shown
  local limit=$1 name=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2> "$OUT/$name.err"; local rc=$?
  [ $rc -eq 0 ] || { echo "$name: rc $rc"; grep -iE "Traceback|Error" -A3 "$OUT/$name.err" | head -8; }
  return $rc
}

tables() {  # the markdown tables of the named logs, each under its name
  local f; for f in "$@"; do [ -f "$OUT/$f.log" ] || continue; echo "-- $f"; grep "^|" "$OUT/$f.log"; done
}

# The synthetic checkpoints (written once per machine under /tmp by the first run that needs them).
CK=/tmp/ft-e2e-qwen3-12           # qwen3-30b-a3b, 12 layers, bf16, ~15 GB
Q36=/tmp/ft-e2e-qwen36-12         # qwen3.6-35b-a3b, 12 layers (9 gated DeltaNet : 3 gated attention), ~19 GB
TRACE=bench/traces/locality-48x128x8.npy
E2E=(python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25)
DEC=(python3 -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --steps 256
  --warmup-tokens 200)

# llama.cpp: the peer, built from .carry/lcpp-src.tgz (the llama-cpp-python sdist's vendored llama.cpp, ~10 MB):
#   d=$(mktemp -d) && (cd $d && python3 -m pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 \
#     && tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor \
#     && rm -rf llama.cpp/models llama.cpp/docs llama.cpp/media llama.cpp/tools/ui \
#     && tar czf lcpp-src.tgz llama.cpp) && mkdir -p .carry && mv $d/llama_cpp_python-*/vendor/lcpp-src.tgz .carry/
LB=/tmp/lc/llama.cpp/build/bin/llama-bench
build_llama() {  # $1: parallel jobs; CUDA for sm_90, flash attention off, llama-bench only (~5 min of the box)
  [ -x $LB ] && return
  [ -f .carry/lcpp-src.tgz ] || { echo "no .carry/lcpp-src.tgz: llama.cpp is not built"; return; }
  [ -d /tmp/lc ] && return  # a build is under way
  (setsid bash -c "mkdir -p /tmp/lc && tar xzf .carry/lcpp-src.tgz -C /tmp/lc && cd /tmp/lc/llama.cpp && \
    cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cmake.log 2>&1 && \
    nice cmake --build build --target llama-bench -j ${1:-12} > /tmp/lc/build.log 2>&1; echo done > /tmp/lc/built" \
    > /dev/null 2>&1 < /dev/null &)
}
wait_llama() {  # $1: how many 5 s waits; fails when the build is not done by then
  for _ in $(seq 1 "$1"); do [ -f /tmp/lc/built ] && [ -x $LB ] && return 0; sleep 5; done; return 1
}
peer_decode() {  # $1: a GGUF, then "n_cpu_moe:threads" pairs; one line of llama-bench decode tok/s each
  local m=$1; shift
  for nt in "$@"; do local ncm=${nt%%:*} th=${nt##*:}
    timeout 60 $LB -m "$m" -ngl 99 --n-cpu-moe "$ncm" -t "$th" -p 0 -n 64 -r 3 -o csv 2>/dev/null | tail -n 1 |
      awk -v n="$ncm" -v t="$th" -v f="$(basename "$m")" -F, '{gsub(/"/,""); print "| " f " | decode | " n " | " t " | " $(NF-1) " (sd " $NF ") |"}'
  done
}
peer_prompt() {  # $1: a GGUF, then prompt lengths; all experts on the CPU (--n-cpu-moe 12), 16 threads
  local m=$1; shift
  for p in "$@"; do
    timeout 120 $LB -m "$m" -ngl 99 --n-cpu-moe 12 -t 16 -p "$p" -n 0 -r 1 -o csv 2>/dev/null | tail -n 1 |
      awk -v p="$p" -v f="$(basename "$m")" -F, '{gsub(/"/,""); print "| " f " | prompt " p " | 12 | 16 | " $(NF-1) " |"}'
  done
}

fused_rows() {  # #39, while llama.cpp builds (nice'd; a fused step leaves the CPU to it): the fused step at batch 1,
  # 6 threads, sampled (temperature 1), greedy and sampled at Qwen's settings (T 0.7, top-k 20, top-p 0.8) in
  # alternating processes (3 rounds), then the qwen3.6 preset's (sampled, medians of 3): sampled / greedy and
  # qwen3.6 / qwen3 within one call
  local F=(--policies fused --cpu-threads 6 --batch 1 --repeats 1 --tokens 128 --warmup 16 --no-moe-only --no-bound) i
  for i in 1 2 3; do
    run_logged 90 "fused_t1_$i" "${E2E[@]}" "${F[@]}" --temperature 1.0
    run_logged 90 "fused_t0_$i" "${E2E[@]}" "${F[@]}" --temperature 0
    run_logged 90 "fused_qw_$i" "${E2E[@]}" "${F[@]}" --temperature 0.7 --top-k 20 --top-p 0.8
  done
  run_logged 150 fused_q36 python3 -m freetoken.bench.e2e --preset qwen3.6-35b-a3b --layers 12 --dir $Q36 \
    --expert-cache 0.25 "${F[@]}" --repeats 3 --temperature 1.0
  # each log's data row, named (t1: temperature 1, t0: greedy, qw: Qwen's settings; q36: the qwen3.6 preset)
  for f in "$OUT"/fused_t1_*.log "$OUT"/fused_t0_*.log "$OUT"/fused_qw_*.log "$OUT"/fused_q36.log; do
    [ -f "$f" ] && echo "$(basename "$f" .log) $(grep "^| [0-9d]" "$f" | tail -1)"
  done | tee "$OUT/fused_rows.md"
  # the qwen3.6 step's kernels (GPU busy, kernels/step, eager fallbacks), whole table under $OUT
  timeout 60 python3 bench/gpu/e2e_profile.py $Q36 --backend fused --batch 1 --top 24 > "$OUT/fused_q36_profile.txt" 2>&1
  tail -1 "$OUT/fused_q36_profile.txt"
}
