#!/usr/bin/env bash
# The GPU box's one runner: `bash bench/gpu/run.sh STAGE [ARG]` from the repository root, one device call a stage
# (each inside 10 minutes), every log whole under $OUT, a short table last. Carry [".whl"] (the wheels: `bash
# bench/gpu/run.sh wheels` on the dev box), `tests` also [".whl-sdk"] (the SDKs), `llamacpp` [".carry"] (lib.sh).
# The box's python3 has torch, triton, numpy, safetensors, tokenizers, hypothesis, pytest-xdist. Benchmarks run on
# synthetic checkpoints written once per machine under /tmp (qwen3-30b-a3b's and qwen3.6-35b-a3b's per-layer shapes,
# 12 layers, 25% expert cache); the replayed routing trace is bench/traces/locality-48x128x8.npy.
#
# Stages (docs/benchmarks.md quotes each figure with its stage):
#   tests SHARD    the test suite on the box: gpu1, gpu2 (the gpu-marked tests, the files split in two halves by name)
#                  or cpu (every other test on the box's 16 cores, server and SDK tests included). Not on the box: the
#                  Chromium chat-page test (no browser) and the npm/PyPI agent clients (no registry).
#   graphs         the step graph for every batch bucket x sampler feature set: eager fallbacks and replays
#   repeat [SECS]  wrong tokens now and then: the tiny hybrid's batched greedy case over and over per backend
#                  (repeat_greedy.py), side by side; .before's fused variant too when carried
#   ab             ft bench e2e from .before/src (carry it) and this tree in alternating runs, medians of 3 (ab.py)
#   memory [ARGS]  the memory plan against the device's taken bytes, per preset and budget (memory_plan.py)
#   e2e [fp8|cpu]  ft bench e2e (the whole model): fused, offload, hybrid, static-layers at 6 and 16 threads, batch 1
#                  and 4, the model's own routing sampled, beside the MoE layers alone; offload and hybrid on the
#                  replayed trace (fp8: the qwen3-30b-a3b-fp8 preset, hybrid / offload / static-layers, batch 1;
#                  cpu: the cpu policy alone, 6 and 16 threads, medians of 3, beside the peer when llamacpp ran)
#   fused          fused_rows (lib.sh): the fused step sampled / greedy alternating and the qwen3.6 preset's (#39)
#   frontier P [C] ft bench e2e --preset P (glm-5, deepseek-v3, ..., kimi-linear, gemma-4, deepseek-v4-flash) at
#                  expert cache C (0.25): hybrid, offload, static-layers, 8 threads, batch 1, sampled; the model's
#                  routing and the locality trace of its experts x top-k (256x8, 128x8, 256x6)
#   fp4 [SLOTS]    qwen3.6-35b-a3b-nvfp4 vs qwen3.6-35b-a3b at the same expert-slot bytes (SLOTS bf16 slots, 256),
#                  hybrid and offload, 6 threads, batch 1, sampled (a first call writes the checkpoints)
#   threads [FMT]  ft bench bw --sweep auto (the default thread count, saved), hybrid e2e at 4-16 threads and the default
#   step [DIR]     the fused decode step under the profiler (e2e_profile.py): kernels per step, GPU busy share,
#                  ms/step at batch 1 and 4, overlap on and off; the host's ops once (DIR: e.g. a frontier preset's
#                  checkpoint, /tmp/ft-e2e-deepseek-v4-flash)
#   experts THREADS [model]   ft bench decode (the MoE layers alone) with the bandwidth probe: every policy on the
#                  replayed trace (or the model's own routing), medians of 3; CORES=0-5 confines it (a 6-core machine)
#   layers         where a MoE layer's device time goes (offload, hybrid; THREADS=6): profiler traces, timeline.py
#   prefill        ft bench prefill (whole-layer double buffering vs serial vs on-demand, 4k-16k) and ft bench e2e
#                  --prefill (TTFT cold / warm +64, GB copied, the PCIe bound; 3 streams' ITL beside a 32k prefill)
#   http           ft bench http: 4 streaming clients through a real ft serve process, 8k-token prompts, TTFT
#   cpu            the CPU expert kernels: bench/cpu_kernel.py (bf16; 6 and 16 threads, called and queued, huge
#                  pages; AVX2 forced) and bench/cpu_formats.py (fp8, MXFP4, NVFP4 at 6 and 16 threads; AVX2
#                  forced at 16; one thread in the L3), beside the streaming read
#   cpufp4         the FP4 dot products alone (bench/fp4_dot.cpp, AVX512-BF16, AVX-512 and AVX2, one thread in L2;
#                  AVX-512 and AVX2 also on 6 and 16 threads, rows in L2 and from DRAM beside the streaming read)
#                  and bench/cpu_formats.py for MXFP4 / NVFP4 at 6 and 16 threads per ISA, gpt-oss's experts
#   vbmi           the FP4 integer paths' vpdpwssd forms against the plain ones, alternating (AVX-512 with VBMI / VNNI;
#                  PAIR=avx2: AVX2 with AVX-VNNI): bench/fp4_dot.cpp (one thread in L2; 6 and 16 threads) and
#                  bench/cpu_formats.py (Qwen3's and gpt-oss's experts)
#   formats        ft bench bw per expert format (bf16, fp8_block, mxfp4, nvfp4) at 6 and 16 threads: B_H, copies
#   kernels        GPU kernels alone: gemm_tiles.py, fp8_gemm.py, fp4_gemm.py (.before carried: that tree's FP4
#                  kernel too), dnstep_time.py, hostckpt_copy.py, sample_time.py (kernel_stages.sh, as vbmi)
#   sampler        the sampler's kernels: their gpu tests, graph_matrix.py (step graph per feature set), sample_time.py
#   contention     fills against the CPU kernel: contention.py (the kernel beside copies / the gather), gather_bw.py
#   fla            the hybrid preset qwen3.6-35b-a3b: fla's kernels per head dims (fla_dims.py), decode e2e vs
#                  MoE-only and the 8k prefill row vs the PCIe bound, with fla and with FREETOKEN_FLA=0
#   elastic        bench/elastic_timeline.py: tok/s while another process takes and frees VRAM (offload, hybrid)
#   load           ft bench load: time to the first token, safetensors vs FTW, beside the raw O_DIRECT read
#   llamacpp       the peer on the same shape (12 layers, bf16 and Q8_0 GGUFs by make_gguf.py): llama-bench decode
#                  at --n-cpu-moe 12 / 9 / 0, 6 and 16 threads, and its prompt rate at 8k; run it in the lease of
#                  the figures it is compared with (a first call starts the ~5 min build and may end before it;
#                  FUSED=1: fused_rows, the fused step sampled / greedy and the qwen3.6 preset's, while it builds)
#   llamacpp_gptoss [prep|e2e]   the peer of --preset gpt-oss-20b (24 layers, MXFP4 experts, make_gguf_gpt_oss.py):
#                  llama-bench decode at --n-cpu-moe 18 (25% cache) / 0 / 24, 6 threads (18 also at 16); e2e: ft bench
#                  e2e --preset gpt-oss-20b fused + hybrid, 6 threads, batch 1, the peer alternating (a second call);
#                  prep: a fresh machine's first call (the build starts; the GGUF and our checkpoint are written)
#   train          the embedded model v2's training run and a quick held-out eval (docs/default_model.md)
#   wheels         (dev box, not the device) download the wheels into .whl/ for the box's Python 3.12
set -uo pipefail
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/gpu/lib.sh
source bench/gpu/peer_stages.sh  # stage_llamacpp, stage_llamacpp_gptoss
source bench/gpu/kernel_stages.sh  # stage_vbmi, stage_kernels, stage_sampler
NOT_HERE=(--ignore=tests/test_chat_page_browser.py --ignore=tests/clients)

gpu_files() {  # $1: 1 or 2 (one half of the files holding gpu-marked tests, alternating by name), or "all"
  python3 -m pytest -q -p no:cacheprovider --collect-only -m gpu "${NOT_HERE[@]}" tests 2>/dev/null |
    grep "::" | cut -d: -f1 | sort -u | awk -v h="$1" 'h == "all" || NR % 2 == h % 2'
}

stage_tests() {
  local shard=${1:?"tests SHARD: gpu1, gpu2, gpu (both) or cpu"} files
  # SIGINT at the limit: pytest stops and still prints its summary (failures, durations). -n: the box's cores compile
  # the Triton kernels in parallel (tiny models; one GPU serves every worker): all gpu tests in 162 s on 8 (H100)
  # (the cpu shard, ~1,900 tests on 14 workers, gets the call's whole 560 s; TEST_LIMIT: a call that ran a stage first)
  local limit=${TEST_LIMIT:-480}; [ "$shard" = cpu ] && limit=${TEST_LIMIT:-560}
  # PEER=1 (carry .carry): llama.cpp builds in the background meanwhile (nice'd, 6 jobs), for the lease's next calls
  [ "${PEER:-0}" = 1 ] && build_llama 6
  local P=(timeout -s INT "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs --durations=40 --timeout=300)
  case $shard in
  gpu|gpu1|gpu2) local h=${shard#gpu}; mapfile -t files < <(gpu_files "${h:-all}")
    "${P[@]}" -v -n "${GPU_WORKERS:-8}" -m gpu "${files[@]}" > "$OUT/tests_$shard.log" 2>&1 ;;
  cpu) "${P[@]}" -n 14 -m "not gpu" "${NOT_HERE[@]}" tests > "$OUT/tests_$shard.log" 2>&1 ;;
  *) echo "unknown shard $shard (gpu1, gpu2, cpu)"; exit 2 ;;
  esac
  echo "rc $? shard $shard: $(summary "$OUT/tests_$shard.log")"
}

stage_ab() {  # carry .before (git archive BASE src | tar -x -C .before): e2e from both trees, alternating (AB_POLICIES,
  # AB_BATCH: other rows, e.g. AB_POLICIES=cpu AB_BATCH=1 for the cpu backend's graphs against 0b63574)
  run_logged 560 ab python3 bench/gpu/ab.py --before .before --after . --rounds 3 --log "$OUT/ab_runs.log" -- \
    --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --policies "${AB_POLICIES:-fused,hybrid}" --cpu-threads 6,16 \
    --batch "${AB_BATCH:-1,4}" \
    --tokens 48 --warmup 8 --no-moe-only
  tail -12 "$OUT/ab.log"
}

stage_memory() {  # the memory plan's shares against what the device shows taken (memory_plan.py)
  run_logged 560 memory python3 bench/gpu/memory_plan.py "$@"
  tail -40 "$OUT/memory.log"
}

stage_e2e() {
  if [ "${1:-bf16}" = fp8 ]; then
    run_logged 420 e2e_fp8 "${E2E[@]}" --preset qwen3-30b-a3b-fp8 --dir /tmp/ft-e2e-qwen3-fp8-12 \
      --policies hybrid,offload,static-layers --cpu-threads 6,16 --batch 1 --repeats 2 --temperature 1.0 \
      --json "$OUT/e2e_fp8.json"
    rm -rf /tmp/ft-e2e-qwen3-fp8-12; tables e2e_fp8; return  # 64 GiB of disk: the other stages' checkpoints stay
  fi
  # llama-bench alternating with the batch-1 rows once `run.sh llamacpp` built it and its GGUF in this lease
  local peer=(); [ -x $LB ] && [ -f /tmp/m.gguf ] && peer=(--peer-llama-cpp $LB /tmp/m.gguf)
  if [ "${1:-bf16}" = cpu ]; then  # #39: every expert on the CPU against the peer's --n-cpu-moe 12, medians of 3
    run_logged 500 e2e_cpu "${E2E[@]}" --policies cpu --cpu-threads 6,16 --batch 1 --repeats 3 --temperature 1.0 \
      "${peer[@]}" --json "$OUT/e2e_cpu.json"
    tables e2e_cpu; return
  fi
  run_logged 330 e2e_model "${E2E[@]}" --policies fused,offload,hybrid,static-layers --cpu-threads 6,16 \
    --batch 1,4 --repeats 2 --temperature 1.0 "${peer[@]}" --json "$OUT/e2e_model.json"
  run_logged 200 e2e_trace "${E2E[@]}" --policies offload,hybrid --cpu-threads 6,16 --batch 1,4 --repeats 2 \
    --routing-trace $TRACE --json "$OUT/e2e_trace.json"
  tables e2e_model e2e_trace
}

stage_frontier() {  # #34 / #38: a frontier preset end to end at one expert-cache share, 8 CPU threads (the paper's
  # RTX 5090 setting), batch 1, sampled: the model's own routing, then a replayed trace of the preset's experts and
  # top-k (locality-62x256x8: 256 experts, top-8, as DeepSeek-V3 / GLM-5 / MiniMax-M2 / Kimi-Linear route;
  # locality-48x128x8: Gemma-4's 128; locality-43x256x6: DeepSeek-V4-Flash's 256, top-6, its first 3 layers routed
  # by token id whatever the trace; the model's MoE layers replay its first layers). FRONTIER_POLICIES: both
  # rows' policies (default hybrid,offload,static-layers)
  local p=${1:?"frontier PRESET [CACHE]"} c=${2:-0.25} name ek trace
  local pol=${FRONTIER_POLICIES:-hybrid,offload,static-layers}
  local F=(python3 -m freetoken.bench.e2e --preset "$p" --dir "/tmp/ft-e2e-$p" --expert-cache "$c" --cpu-threads 8
    --policies "$pol" --batch 1 --repeats 2 --temperature 1.0 --tokens 32 --warmup 8)
  name=fr_${p}_$c
  # the first call writes the checkpoint (31-37 GB): another preset's checkpoint goes first when the 64 GiB disk would
  # not hold both (a DeepSeek-V3 write failed with "No space left on device" beside V4-Flash's)
  local free_gb; free_gb=$(df -BG --output=avail /tmp | tail -1 | tr -dc 0-9)
  [ -d "/tmp/ft-e2e-$p" ] || [ "$free_gb" -ge 40 ] || find /tmp -maxdepth 1 -name 'ft-e2e-*' ! -name "ft-e2e-$p" \
    -exec rm -rf {} +
  run_logged 330 "$name" "${F[@]}" --json "$OUT/$name.json"
  ek=$(python3 -c "from freetoken.bench.presets import PRESETS as P; s = P['$p']; print(f'{s.experts}x{s.top_k}')")
  trace=$(ls bench/traces/locality-*x"$ek".npy 2>/dev/null | head -1)
  [ -n "$trace" ] || { echo "no locality trace of ${ek} experts x top-k: the model's routing only"; tables "$name"; return; }
  run_logged 180 "${name}_trace" "${F[@]}" --no-moe-only \
    --routing-trace "$trace" --json "$OUT/${name}_trace.json"
  tables "$name" "${name}_trace"
}

stage_fp4() {  # #35: the NVFP4 preset against its bf16 preset at the same VRAM bytes of expert slots (6 threads: the
  # laptop's setting); $1 bf16 slots (256 of the 12 layers' 3,072 experts), NVFP4 gets as many bytes' worth
  local s16=${1:-256} s4
  s4=$(python3 -c "from freetoken.bench.presets import PRESETS as P
print($s16 * P['qwen3.6-35b-a3b'].expert_bytes() // P['qwen3.6-35b-a3b-nvfp4'].expert_bytes())")
  local C=(--cpu-threads 6 --batch 1 --repeats 2 --temperature 1.0 --tokens 32 --warmup 8 --policies hybrid,offload)
  echo "bf16 slots $s16, nvfp4 slots $s4 (the same bytes)"
  run_logged 280 fp4_bf16 python3 -m freetoken.bench.e2e --preset qwen3.6-35b-a3b --dir $Q36 --expert-cache "$s16" \
    "${C[@]}" --json "$OUT/fp4_bf16.json"
  run_logged 280 fp4_nvfp4 python3 -m freetoken.bench.e2e --preset qwen3.6-35b-a3b-nvfp4 --dir /tmp/ft-e2e-qwen36-nvfp4 \
    --expert-cache "$s4" "${C[@]}" --json "$OUT/fp4_nvfp4.json"
  tables fp4_bf16 fp4_nvfp4
}

stage_threads() {  # #39: ft bench bw --sweep auto (saved: the default --cpu-threads), then hybrid end to end at each
  # count and at the default (no --cpu-threads): more threads must never make decode slower
  run_logged 240 sweep python3 -m freetoken.cli bench bw --sweep auto --weights "${1:-bf16}" --seconds 0.5
  local T=("${E2E[@]}" --policies hybrid --batch 1 --repeats 2 --temperature 1.0 --tokens 32 --warmup 8 --no-moe-only)
  run_logged 240 e2e_threads "${T[@]}" --cpu-threads 4,6,8,12,16
  run_logged 80 e2e_default "${T[@]}"
  grep "^|" "$OUT/sweep.log" | head -12; tables e2e_threads e2e_default
}

stage_step() {  # [DIR]: another checkpoint (a frontier preset's, written by `frontier`; $Q36 written here), else qwen3's
  local ck=${1:-$CK} preset=qwen3-30b-a3b
  [ "$ck" = $Q36 ] && preset=qwen3.6-35b-a3b
  [ -f $ck/model.safetensors.index.json ] || run_logged 150 write "${E2E[@]}" --preset $preset --dir "$ck" \
    --policies fused --batch 1 --tokens 8 --repeats 1 --no-moe-only
  local b ov
  for b in 1 4; do for ov in overlap no-overlap; do
    timeout 60 python3 bench/gpu/e2e_profile.py $ck --backend fused --batch $b --$ov --top 30 \
      > "$OUT/profile_b${b}_$ov.txt" 2>&1 || tail -5 "$OUT/profile_b${b}_$ov.txt"
  done; done
  timeout 60 python3 bench/gpu/e2e_profile.py $ck --backend fused --host-ops --top 30 > "$OUT/profile_host.txt" 2>&1
  echo "| batch | overlap | profiled step (kernels/step, GPU busy, ms/step) |"; echo "|---|---|---|"
  for b in 1 4; do for ov in overlap no-overlap; do
    echo "| $b | $ov | $(grep "kernels/step" "$OUT/profile_b${b}_$ov.txt" | tail -1) |"
  done; done
}

stage_experts() {
  local t=${1:?"experts THREADS [model]"} routing=(--routing-trace $TRACE) pin=() name
  name=experts$t${2:+_$2}; [ "${2:-trace}" = model ] && routing=()
  [ -n "${CORES:-}" ] && pin=(taskset -c "$CORES")
  run_logged 540 "$name" "${pin[@]}" "${DEC[@]}" --cpu-threads "$t" --repeats 3 --measure-bw --runahead \
    "${routing[@]}" --policies "${POLICIES:-fused,offload,cpu,hybrid,static-layers,static-freq}" --json "$OUT/$name.json"
  cat "$OUT/$name.log"
}

stage_layers() {
  run_logged 240 layers "${DEC[@]}" --cpu-threads "${THREADS:-6}" --repeats 1 --steps 128 --routing-trace $TRACE \
    --runahead --profile-dir "$OUT/prof" --policies offload,hybrid
  local f; for f in "$OUT"/prof/*.json; do
    echo "-- $(basename "$f")"; python3 bench/gpu/timeline.py "$f" --layers
    python3 bench/gpu/timeline.py "$f" --count 40 > "${f%.json}.timeline.txt"; gzip -f "$f"
  done
}

stage_prefill() {
  run_logged 140 prefill_modes python3 -m freetoken.bench.prefill --preset qwen3-30b-a3b --layers 12 \
    --tokens 4096,8192,16384 --chunk 8192 --modes stream,serial,ondemand --repeats 2 --json "$OUT/prefill_modes.json"
  run_logged 240 ttft_hybrid "${E2E[@]}" --cpu-threads 16 --policies hybrid --no-decode --repeats 1 \
    --prefill 2048,8192,32768 --itl-prompt 32768 --json "$OUT/ttft_hybrid.json"
  run_logged 90 ttft_fused "${E2E[@]}" --cpu-threads 16 --policies fused --no-decode --repeats 1 \
    --prefill 8192,32768 --json "$OUT/ttft_fused.json"
  tables prefill_modes ttft_hybrid ttft_fused
}

stage_http() {
  [ -f $CK/model.safetensors.index.json ] || run_logged 120 write "${E2E[@]}" --policies fused --batch 1 --tokens 8 \
    --repeats 1 --no-moe-only
  run_logged 300 http_ttft python3 -m freetoken.bench.http_ttft --layers 12 --dir $CK --policy hybrid \
    --expert-cache 0.25 --cpu-threads 16 --clients 4 --prompt-tokens 8192 --rounds 3 --max-tokens 8 \
    --server-log "$OUT/http_server.log" --json "$OUT/http_ttft.json"
  tables http_ttft
}

stage_cpu() {
  run_logged 240 cpu_kernel python3 bench/cpu_kernel.py --threads 6,16 --read-gib 4 --pool-gib 2 --iters 10 --seq 12 \
    --huge-pages on --queued
  run_logged 70 cpu_kernel_avx2 python3 bench/cpu_kernel.py --threads 16 --read-gib 2 --pool-gib 2 --iters 10 \
    --seq 12 --huge-pages on --isa avx2
  run_logged 200 cpu_formats python3 bench/cpu_formats.py --threads 6,16 --iters 7 --pool-gib 2 --read-gib 4
  run_logged 100 cpu_formats_avx2 python3 bench/cpu_formats.py --threads 16 --iters 5 --pool-gib 2 --read-gib 2 \
    --isa avx2
  # one thread on a pool that fits the L3 (32 experts, 75 MB of FP4): the kernel's compute rate without DRAM
  run_logged 90 cpu_formats_l3 python3 bench/cpu_formats.py --threads 1 --iters 7 --pool-gib 0.05 --read-gib 1
  tables cpu_kernel cpu_kernel_avx2 cpu_formats cpu_formats_avx2 cpu_formats_l3
}

stage_cpufp4() {  # #35: the FP4 dot products alone (bench/fp4_dot.cpp: one thread in L2; 6 and 16 threads), the kernel
  local f=(-std=c++17 -O3 -mavx2 -mfma -mf16c -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp)
  g++ "${f[@]}" -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -o /tmp/fp4_dot && /tmp/fp4_dot > "$OUT/fp4_dot.log" 2>&1
  # the AVX-512 integer and AVX2 paths also on 6 and 16 threads: rows in L2, rows from DRAM, the streaming read
  g++ "${f[@]}" -mavx512f -mavx512bw -mavx512vl -DFT_BENCH_AVX512 -o /tmp/fp4_dot5 && /tmp/fp4_dot5 6 16 \
    > "$OUT/fp4_dot_avx512.log" 2>&1
  g++ "${f[@]}" -DFT_BENCH_AVX2 -o /tmp/fp4_dot2 && /tmp/fp4_dot2 6 16 > "$OUT/fp4_dot_avx2.log" 2>&1
  # the kernel per ISA (auto is the AVX-512 integer path on an Intel host with AVX-512)
  run_logged 100 cpufp4_avx2 python3 bench/cpu_formats.py --formats mxfp4,nvfp4 --threads 6,16 --iters 5 --pool-gib 2 \
    --read-gib 2 --isa avx2
  run_logged 100 cpufp4_avx512 python3 bench/cpu_formats.py --formats mxfp4,nvfp4 --threads 6,16 --iters 5 \
    --pool-gib 2 --read-gib 2 --isa avx512
  # gpt-oss-20b's experts (2880 x 2880, top-4, MXFP4 as shipped): rows of 2,880 codes end in a partial span of scales
  run_logged 120 cpufp4_gptoss python3 bench/cpu_formats.py --formats mxfp4 --threads 6,16 --iters 5 --pool-gib 2 \
    --read-gib 2 --isa avx512 --hidden 2880 --inter 2880 --top-k 4
  lscpu | grep -E "^(Model name|Thread|Core|Socket)" | tee "$OUT/lscpu.txt"
  tables fp4_dot fp4_dot_avx512 fp4_dot_avx2 cpufp4_avx2 cpufp4_avx512 cpufp4_gptoss
}

stage_contention() {
  run_logged 200 contention python3 bench/gpu/contention.py --threads 6 --experts 1,2,8 --seconds 1.5 --repeats 2
  run_logged 120 gather_bw python3 bench/gpu/gather_bw.py
  tail -20 "$OUT/contention.log"; tail -12 "$OUT/gather_bw.log"
}

stage_fla() {
  run_logged 60 fla_dims python3 bench/gpu/fla_dims.py
  local E36=("${E2E[@]}" --preset qwen3.6-35b-a3b --dir $Q36 --cpu-threads 16) mode flag
  for mode in fla torch; do
    flag=1; [ $mode = torch ] && flag=0
    FREETOKEN_FLA=$flag run_logged 170 "q36_decode_$mode" "${E36[@]}" --policies hybrid,fused --batch 1,4 \
      --repeats 2 --json "$OUT/q36_decode_$mode.json"
    FREETOKEN_FLA=$flag run_logged 60 "q36_prefill_$mode" "${E36[@]}" --policies hybrid --no-decode --prefill 8192 \
      --repeats 1 --json "$OUT/q36_prefill_$mode.json"
  done
  rm -rf $Q36  # 19 GB of the box's 64 GiB
  grep "^dk" "$OUT/fla_dims.log"; tables q36_decode_fla q36_decode_torch q36_prefill_fla q36_prefill_torch
}

stage_elastic() {
  python3 -c "import pynvml" 2>/dev/null || echo "pynvml (nvidia-ml-py) missing: the VRAM watcher is off"
  run_logged 300 timeline python3 bench/elastic_timeline.py --out "$OUT" --layers 6 --dir /tmp/ft-elastic-qwen3-6 \
    --budget 40 --reserve 1.5 --free-left 2 --tokens 512 --plan "${PLAN:-2:8,5:0,8:30,11:0}" --seconds 14 \
    --base-seconds 3 --backends "${BACKENDS:-offload,hybrid}" --pinned-half
  grep -E "^#|tok_s|first_shrink|other_had_all|back_to_90|same_tokens|PASS|FAIL" "$OUT/timeline.log" | head -60
}

stage_load() {
  rm -rf /tmp/ft-e2e-* /tmp/ft-elastic-*  # 64 GiB of disk: the load's checkpoint and its FTW form beside it
  run_logged 480 ftw_load python3 -m freetoken.bench.ftw_load --preset qwen3-30b-a3b --layers 12 --repeats 2 \
    --moe-backend hybrid --expert-cache 0.25 --json "$OUT/ftw_load.json"
  cat "$OUT/ftw_load.log"
}

stage_fused() { fused_rows; }  # lib.sh: sampled / greedy and qwen3.6 / qwen3, the fused step alone (no peer build)

stage_train() {  # ~9.5 min: data + fla's gradient check + training (400 s on the clock), then a quick eval
  local log=$OUT/run.log t0; t0=$(date +%s)
  python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" \
    > "$log" 2>&1
  python3 -c "import fla; print('fla-core', fla.__version__)" >> "$log" 2>&1
  # the schedule across runs: continue the repository's checkpoint (training/default_model_v2/checkpoint, the latest
  # run's $OUT/model copied in and committed), else start one V2_SCHEDULE_S training seconds long
  local ck=training/default_model_v2/checkpoint from=(--schedule-seconds "${V2_SCHEDULE_S:-4000}")
  [ -f "$ck/schedule.json" ] && from=(--resume "$ck")
  timeout 450 python3 -m training.default_model_v2.train --out "$OUT/model" --time-budget 400 --workers 15 \
    "${from[@]}" ${V2_TRAIN_ARGS:-} >> "$log" 2>&1
  echo "[sh] train rc $? after $(( $(date +%s) - t0 )) s" >> "$log"
  grep -q "chunk_gated_delta_rule. is falling back\|fla's gradients disagree" "$log" \
    && echo "[sh] WARNING: fla was not used: the DeltaNet trained on transformers' torch loop" >> "$log"
  local left=$(( 560 - $(date +%s) + t0 ))  # the call's 600 s, less a margin; the full eval: docs/default_model.md
  [ $left -gt 30 ] && timeout $left python3 -m training.default_model_v2.evaluate --model "$OUT/model" \
    --device "${V2_DEVICE:-cuda}" --n-tool 40 --n-arith 20 --n-none 20 >> "$log" 2>&1
  echo "[sh] eval rc $? after $(( $(date +%s) - t0 )) s" >> "$log"
  grep -E "^\[(fla-check|data|model|done|schedule|eval|sh)\]|is falling back|Error" "$log" | grep -v "^\[eval\] .* miss" \
    | tail -40
}

stage_repeat() {  # repeat_greedy.py: each variant SECONDS (240) side by side; with .before carried (git archive BASE
  # src | tar -x -C .before) its fused variant too, from that tree
  local secs=${1:-240} v
  for v in fused offload hybrid hybrid-eager; do
    timeout $((secs + 150)) python3 bench/gpu/repeat_greedy.py "$v" --seconds "$secs" > "$OUT/repeat_$v.log" 2>&1 &
  done
  timeout $((secs + 150)) python3 bench/gpu/repeat_greedy.py fused --family qwen3_moe --seed 2 --seconds "$secs" \
    > "$OUT/repeat_fused_qwen3_moe.log" 2>&1 &  # pads without state slots (row 0 repeated): benign?
  [ -d .before/src ] && PYTHONPATH=$PWD/.before/src:$PWD/tests:/tmp/site timeout $((secs + 150)) \
    python3 bench/gpu/repeat_greedy.py fused --seconds "$secs" > "$OUT/repeat_before_fused.log" 2>&1 &
  wait
  for v in "$OUT"/repeat_*.log; do echo "$(basename "$v" .log): $(grep RESULT "$v" || tail -2 "$v")"; done
}

stage=${1:-}; shift || true
case $stage in
wheels) download_wheels ;;
tests|graphs|repeat|ab|memory|e2e|fused|frontier|fp4|threads|step|experts|layers|prefill|http|cpu|formats|kernels|\
contention|fla|elastic|load|cpufp4|\
llamacpp|llamacpp_gptoss|train)
  install_wheels
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nvidia-smi --query-gpu=name --format=csv,noheader \
    2>/dev/null | head -1), $(nproc) CPUs" | tee "$OUT/machine.txt"
  if [ "$stage" = graphs ]; then
    timeout 240 python3 bench/gpu/graph_matrix.py > "$OUT/graphs.log" 2>&1; echo "rc $?"; tail -30 "$OUT/graphs.log"
    timeout 240 python3 bench/gpu/graph_matrix.py --family qwen3_5_moe > "$OUT/graphs_states.log" 2>&1; echo "rc $?"
    tail -30 "$OUT/graphs_states.log"
  else "stage_$stage" "$@"; fi ;;
*) echo "usage: bash bench/gpu/run.sh STAGE [ARG] (stages: the list at the top of this file)"; exit 2 ;;
esac
