# Shared pieces of the GPU-box scripts (source it): the llama.cpp peer built in the background from
# .carry/lcpp-src.tgz (it outlives the device call on a warm machine), and waiting for it.
LB=/tmp/lc/llama.cpp/build/bin/llama-bench
build_llama() {  # $1: parallel jobs (default 10)
  [ -x $LB ] && return
  [ -f .carry/lcpp-src.tgz ] || { echo "no .carry/lcpp-src.tgz: llama.cpp is not built"; return; }
  (setsid bash -c "mkdir -p /tmp/lc && tar xzf .carry/lcpp-src.tgz -C /tmp/lc && cd /tmp/lc/llama.cpp && \
    cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cmake.log 2>&1 && \
    nice cmake --build build --target llama-bench -j ${1:-10} > /tmp/lc/build.log 2>&1; echo done > /tmp/lc/built" \
    > /dev/null 2>&1 < /dev/null &)
}
wait_llama() {  # $1: how many 5 s waits (default 60); fails when the build is not done by then
  for _ in $(seq 1 "${1:-60}"); do [ -f /tmp/lc/built ] && [ -x $LB ] && return 0; sleep 5; done; return 1
}
peer_decode() {  # $1: a GGUF, then "n_cpu_moe:threads" pairs; one line of llama-bench decode tok/s each
  local m=$1; shift
  for nt in "$@"; do local ncm=${nt%%:*} th=${nt##*:}
    timeout 45 $LB -m "$m" -ngl 99 --n-cpu-moe "$ncm" -t "$th" -p 0 -n 64 -r 3 -o csv 2>/dev/null | tail -n 1 |
      awk -v n="$ncm" -v t="$th" -v f="$(basename "$m")" -F, '{gsub(/"/,""); print "llama.cpp " f " decode n_cpu_moe=" n " threads=" t ": " $(NF-1) " tok/s (sd " $NF ")"}'
  done
}
