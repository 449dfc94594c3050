# The llama.cpp peer's stages of bench/gpu/run.sh (sourced after lib.sh, whose build_llama, wait_llama, peer_decode,
# peer_prompt and fused_rows they use): `llamacpp` (the Qwen3 shape's GGUFs) and `llamacpp_gptoss` (gpt-oss-20b's).

stage_llamacpp() {  # FUSED=1: fused_rows while the peer builds (a fresh machine's first call)
  build_llama 14
  [ "${FUSED:-0}" = 1 ] && [ ! -x $LB ] && fused_rows
  wait_llama 60 || { echo "llama.cpp still building (or failed: $(tail -3 /tmp/lc/build.log 2>/dev/null)): call again"; return; }
  export PYTHONPATH=/tmp/lc/llama.cpp/gguf-py:$PYTHONPATH
  printf '| GGUF | test | --n-cpu-moe | threads | tok/s |\n|---|---|---|---|---|\n' | tee "$OUT/llamacpp.md"
  [ -f /tmp/m.gguf ] || timeout 120 python3 bench/gpu/make_gguf.py /tmp/m.gguf 12 bf16 > "$OUT/gguf.log" 2>&1
  if [ -n "${PAIRS:-}" ]; then  # PAIRS="0:6 9:6": those decode rows only (a lease whose next call runs the e2e)
    peer_decode /tmp/m.gguf $PAIRS | tee -a "$OUT/llamacpp.md"; return
  fi
  { peer_decode /tmp/m.gguf 12:6 12:16 9:6 9:16 0:6 0:16; peer_prompt /tmp/m.gguf 8192; } | tee -a "$OUT/llamacpp.md"
  [ $SECONDS -lt 420 ] && timeout 120 python3 bench/gpu/make_gguf.py /tmp/q8.gguf 12 q8_0 >> "$OUT/gguf.log" 2>&1 \
    && peer_decode /tmp/q8.gguf 9:6 9:16 | tee -a "$OUT/llamacpp.md"; rm -f /tmp/q8.gguf
}

stage_llamacpp_gptoss() {  # #35: the peer of --preset gpt-oss-20b (24 layers, MXFP4 experts; make_gguf_gpt_oss.py,
  # 13.75 GB): llama-bench decode at --n-cpu-moe 18 (our 25% cache: 24 - round(0.25 * 24), llama_peer.n_cpu_moe_for),
  # 0 (every expert on the GPU) and 24 (none), 6 threads, 18 also at 16; `llamacpp_gptoss e2e` then runs ft bench e2e
  # --preset gpt-oss-20b (fused, hybrid; 6 threads, batch 1, sampled) with the peer alternating; `llamacpp_gptoss prep`
  # (a fresh machine's first call) starts the build and writes the GGUF and our 14 GB checkpoint meanwhile
  build_llama 14
  local g=/tmp/gptoss.gguf ck=/tmp/ft-e2e-gpt-oss-20b
  if [ "${1:-}" = prep ]; then  # a fresh machine's first call: the build runs on while both checkpoints are written
    local i; for i in $(seq 1 30); do [ -d /tmp/lc/llama.cpp/gguf-py ] && break; sleep 2; done
    [ -f $g ] || PYTHONPATH=/tmp/lc/llama.cpp/gguf-py:$PYTHONPATH run_logged 300 gguf_gptoss \
      python3 bench/gpu/make_gguf_gpt_oss.py $g 24 || rm -f $g
    [ -f $ck/model.safetensors.index.json ] || run_logged 240 ck_gptoss python3 -m freetoken.bench.e2e --preset \
      gpt-oss-20b --dir $ck --policies fused --batch 1 --tokens 2 --warmup 1 --repeats 1 --no-moe-only --no-bound
    ls -la $g; du -sh $ck; echo "llama.cpp build: $(tail -1 /tmp/lc/build.log 2>/dev/null)"; return
  fi
  wait_llama 60 || { echo "llama.cpp still building (or failed: $(tail -3 /tmp/lc/build.log 2>/dev/null)): call again"; return; }
  export PYTHONPATH=/tmp/lc/llama.cpp/gguf-py:$PYTHONPATH
  local free_gb; free_gb=$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)  # 64 GB disk: other stages' checkpoints
  [ -f $g ] || [ "$free_gb" -ge 16 ] || { echo "only ${free_gb} GB free under /tmp (the GGUF needs 14): rm -rf /tmp/ft-e2e-*"; return; }
  [ -f $g ] || run_logged 300 gguf_gptoss python3 bench/gpu/make_gguf_gpt_oss.py $g 24 || { rm -f $g; return; }
  if [ "${1:-}" = e2e ]; then
    run_logged 500 e2e_gptoss python3 -m freetoken.bench.e2e --preset gpt-oss-20b --dir $ck \
      --expert-cache 0.25 --policies fused,hybrid --cpu-threads 6 --batch 1 --repeats 2 --temperature 1.0 \
      --peer-llama-cpp $LB $g --json "$OUT/e2e_gptoss.json"
    tables e2e_gptoss; return
  fi
  printf '| GGUF | test | --n-cpu-moe | threads | tok/s |\n|---|---|---|---|---|\n' | tee "$OUT/llamacpp_gptoss.md"
  peer_decode $g 18:6 0:6 24:6 18:16 | tee -a "$OUT/llamacpp_gptoss.md"
}
