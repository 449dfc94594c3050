# The kernels' stages of bench/gpu/run.sh (sourced after lib.sh, whose run_logged, tables and summary they use):
# `vbmi` (the CPU FP4 paths' vpdpwssd forms), `kernels` (the GPU kernels alone), `sampler` (the sampler's kernels).

stage_vbmi() {  # #35: the FP4 integer paths' vpdpwssd forms against the plain ones, alternating (PAIR=avx2: AVX2 with
  # AVX-VNNI against AVX2; else AVX-512 with VBMI / VNNI against AVX-512): the dot products alone (one thread in L2;
  # 6 and 16 threads, L2 / DRAM / the streaming read), then the kernel (bench/cpu_formats.py) on Qwen3's and
  # gpt-oss's experts, batch 1 and 4, 6 and 16 threads
  local f=(-std=c++17 -O3 -mavx2 -mfma -mf16c -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp) r isa
  local plain=avx512 vnni=avx512vbmi pf=(-mavx512f -mavx512bw -mavx512vl -DFT_BENCH_AVX512)
  local vf=(-mavx512f -mavx512bw -mavx512vl -mavx512vbmi -mavx512vnni -DFT_BENCH_AVX512VBMI)
  if [ "${PAIR:-}" = avx2 ]; then plain=avx2 vnni=avx2vnni pf=(-DFT_BENCH_AVX2) vf=(-mavxvnni -DFT_BENCH_AVX2VNNI); fi
  g++ "${f[@]}" "${pf[@]}" -o /tmp/dot_plain && g++ "${f[@]}" "${vf[@]}" -o /tmp/dot_vnni || return
  for r in 1 2; do
    /tmp/dot_plain 6 16 > "$OUT/dot_${plain}_$r.log" 2>&1; /tmp/dot_vnni 6 16 > "$OUT/dot_${vnni}_$r.log" 2>&1
  done
  local fmt=(--formats mxfp4,nvfp4 --threads 6,16 --iters 5 --pool-gib 2 --read-gib 2)
  local oss=(--formats mxfp4 --threads 6,16 --iters 5 --pool-gib 2 --read-gib 2 --hidden 2880 --inter 2880 --top-k 4)
  for isa in $plain $vnni; do run_logged 110 "k_$isa" python3 bench/cpu_formats.py "${fmt[@]}" --isa $isa; done
  for isa in $plain $vnni; do run_logged 110 "oss_$isa" python3 bench/cpu_formats.py "${oss[@]}" --isa $isa; done
  tables "dot_${plain}_1" "dot_${vnni}_1" "dot_${plain}_2" "dot_${vnni}_2" "k_$plain" "k_$vnni" "oss_$plain" "oss_$vnni"
}

stage_formats() {  # the CPU kernel's B_H and the copies per expert format (packed bytes), 6 and 16 threads
  local w t
  for w in bf16 fp8_block mxfp4 nvfp4; do for t in 6 16; do
    run_logged 60 "bw_${w}_$t" python3 -m freetoken.cli bench bw --weights "$w" --threads "$t" --no-save --seconds 1 \
      --read-gib 4 --pool-gib 2
  done; done
  for w in bf16 fp8_block mxfp4 nvfp4; do for t in 6 16; do
    echo "$w $t: $(grep -E '^\| (host read|B_H.?|B_P,fill|B_P.?) \|' "$OUT/bw_${w}_$t.log" | awk -F'|' '{printf "%s=%s ", $2, $3}')"
  done; done
}

stage_kernels() {
  run_logged 90 gemm_tiles python3 bench/gpu/gemm_tiles.py
  run_logged 150 fp8_gemm python3 bench/gpu/fp8_gemm.py
  local before=(); [ -d .before/src ] && before=(--before .before/src)  # that tree's FP4 kernel in the same loop
  run_logged 200 fp4_gemm python3 bench/gpu/fp4_gemm.py "${before[@]}"
  FREETOKEN_FLA=0 run_logged 90 dnstep_time python3 bench/gpu/dnstep_time.py
  run_logged 90 hostckpt_copy python3 bench/gpu/hostckpt_copy.py
  run_logged 90 sample_time python3 bench/gpu/sample_time.py
  run_logged 240 dsa_time python3 bench/gpu/dsa_time.py  # DSA's Triton scores / prefill against the torch path
  tables gemm_tiles fp8_gemm fp4_gemm dnstep_time sample_time dsa_time; echo "-- hostckpt_copy"; cat "$OUT/hostckpt_copy.log"
}

stage_sampler() {  # #39: the sampler's Triton kernels on CUDA (their gpu tests, the step graph per sampler feature set
  # against eager), then their times (sample_time.py: greedy / temperature / top-p / Qwen's top-k / penalties /
  # logprobs, torch against the kernels, and the launch-shape sweeps)
  run_logged 240 sampler_tests python3 -m pytest -q -m gpu tests/test_topk_kernel.py tests/test_logprobs_kernel.py \
    tests/test_penalty_kernel.py tests/test_nucleus_kernel.py tests/test_sampler.py tests/test_sampler_graph.py
  summary "$OUT/sampler_tests.log"
  run_logged 150 sampler_graphs python3 bench/gpu/graph_matrix.py
  grep -E "cases ok" "$OUT/sampler_graphs.log"
  run_logged 150 sample_time python3 bench/gpu/sample_time.py
  tables sample_time
}
