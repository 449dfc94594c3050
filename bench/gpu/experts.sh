#!/usr/bin/env bash
# GPU box acceptance run for the expert hierarchy. Needs the traces carried in .carry/traces (copies of
# ../shared/traces). Writes logs, JSON and profiler traces under $OUT; prints a short table last.
# Stages (default: all; each fits one device call with the others left out, see README.md):
#   tests     GPU tests of every backend, the streamed CPU branch, the CPU kernel, reference models (~3 min)
#   queue     CPU kernel queue tests (spinning feeder and workers: only machines with >= 8 cores spin)
#   quick     only the streamed CPU branch and backend GPU tests (~1.5 min)
#   kernel    CPU expert kernel bench, AVX-512 and forced AVX2 (~3 min): SEQ (12) calls back to back per
#             measurement, pool on 4 KiB and huge pages (HUGE=off,on), ROWS (1,4); QUEUED=1: also queued
#             back to back as decode runs them (n-1 workers + the feeder); AVX2= skips the AVX2 run
#   decode6   ft bench decode, replayed trace, 6 CPU threads, 3 repeats, runahead (~4 min; EAGER=1: MoE layers
#             without CUDA graphs, POLICIES=a,b,...: the policies; variants side by side as backend+option:
#             hybrid+ff40 (a fixed fill fraction), hybrid+lag (the host one step behind), PROF=1: a profiler trace)
#   decode16  the same with 16 CPU threads (~4 min)
#   model     the model's own routing, THREADS (6) threads, REPEATS (3) repeats (~3 min)
#   graphs    offload / hybrid / static-* with MoE layers replayed as CUDA graphs (the default), GPU tests
#             of the graphs, 6 threads, 3 repeats (~3 min)
#   profile   one profiler trace of hybrid decode steps (eager, then graphed) to $OUT/prof (~1 min)
#   layers    where each policy's layer time goes: profiler traces of POLICIES (offload,hybrid), THREADS (6)
#             threads, graphed, and bench/gpu/timeline.py --layers of each (~2 min)
#   threads16 hybrid at THREADS16 (14,15,16) CPU threads on the 16-core box, CPU batches traced (--cpu-trace), 3 repeats: does
#             the engine thread beside 16 computing threads stall the CPU branch? (~5 min)
#   cores6    a 6-core machine: the process on CPUs 0-5 (taskset), default CPU threads (5), so the kernel's
#             workers do not spin (< 8 cores); 3 processes, offload / hybrid / static-layers (~3 min)
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TRACE=.carry/traces/locality-48x128x8.npy
DEC="python3 -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25"
STAGES=${*:-tests kernel decode6 decode16 model}
for stage in $STAGES; do case $stage in
tests) echo "== GPU tests"; timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/test_cpu_stream_gpu.py \
  tests/test_backends.py tests/test_cpu_kernel.py tests/test_cpu_kernel_queue.py tests/test_hardware.py \
  tests/test_reference_models.py tests/test_layer_graphs_gpu.py tests/test_cpu_stream.py > "$OUT/gpu_tests.log" 2>&1
  tail -3 "$OUT/gpu_tests.log"; grep -E "FAILED|Error" "$OUT/gpu_tests.log" | head -20 ;;
queue) echo "== CPU kernel queue tests"; timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kernel_queue.py \
  > "$OUT/queue_tests.log" 2>&1; tail -2 "$OUT/queue_tests.log" ;;
quick) echo "== GPU tests (streamed CPU branch, backends)"; timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_cpu_stream_gpu.py tests/test_backends.py > "$OUT/gpu_tests.log" 2>&1
  tail -3 "$OUT/gpu_tests.log"; grep -E "FAILED|Error" "$OUT/gpu_tests.log" | head -20 ;;
kernel) echo "== CPU expert kernel"; timeout 240 python3 bench/cpu_kernel.py --threads ${KTHREADS:-6,16} --read-gib 4 --pool-gib 2 \
  --iters ${KITERS:-10} --seq ${SEQ:-12} --huge-pages ${HUGE:-off,on} ${QUEUED:+--queued} --rows ${ROWS:-1,4} \
  > "$OUT/cpu_kernel.log" 2>&1; tail -18 "$OUT/cpu_kernel.log"
  [ -n "${AVX2-1}" ] && timeout 90 python3 bench/cpu_kernel.py --threads 16 --read-gib 2 --pool-gib 2 \
  --iters ${KITERS:-10} --seq ${SEQ:-12} --huge-pages on --isa avx2 --rows ${ROWS_AVX2:-1,2} \
  > "$OUT/cpu_kernel_avx2.log" 2>&1 && tail -4 "$OUT/cpu_kernel_avx2.log" ;;
decode6|decode16) t=${stage#decode}; echo "== decode, replayed trace, $t threads"
  timeout "${DEC_TIMEOUT:-280}" $DEC --cpu-threads "$t" --repeats 3 --steps 256 --warmup-tokens 200 --routing-trace $TRACE \
  --measure-bw --runahead ${EAGER:+--no-cuda-graphs} ${PROF:+--profile-dir "$OUT/prof$t"} \
  ${POLICIES:+--policies $POLICIES} \
  --json "$OUT/decode_trace$t.json" \
  > "$OUT/decode_trace$t.log" 2> "$OUT/decode_trace$t.err"; cat "$OUT/decode_trace$t.log"; tail -3 "$OUT/decode_trace$t.err" ;;
model) echo "== decode, the model's own routing"; timeout "${DEC_TIMEOUT:-280}" $DEC --cpu-threads "${THREADS:-6}" \
  --repeats "${REPEATS:-3}" --steps 256 --warmup-tokens 200 --measure-bw ${EAGER:+--no-cuda-graphs} --json "$OUT/decode_model.json" > "$OUT/decode_model.log" 2> "$OUT/decode_model.err"
  cat "$OUT/decode_model.log" ;;
graphs) echo "== CUDA-graph MoE layers"; timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_layer_graphs_gpu.py > "$OUT/graph_tests.log" 2>&1; tail -3 "$OUT/graph_tests.log"
  timeout "${DEC_TIMEOUT:-280}" $DEC --cpu-threads 6 --repeats 3 --steps 256 --warmup-tokens 200 --routing-trace $TRACE \
  --measure-bw --runahead --cuda-graphs --policies fused,offload,hybrid,static-layers --json "$OUT/decode_graphs.json" \
  > "$OUT/decode_graphs.log" 2> "$OUT/decode_graphs.err"; cat "$OUT/decode_graphs.log"; tail -3 "$OUT/decode_graphs.err" ;;
profile) echo "== hybrid profiler traces"; for g in ${PROFILE_MODES:-eager graphs}; do f=--cuda-graphs; [ $g = eager ] && f=--no-cuda-graphs
  timeout 100 $DEC --cpu-threads "${THREADS:-6}" --repeats 1 --steps 64 --warmup-tokens 64 --routing-trace $TRACE --runahead \
  --profile-dir "$OUT/prof-$g" $f --policies hybrid 2>/dev/null | tail -3; cut -c1-90 "$OUT"/prof-$g/*.txt | head -60
  rm -f "$OUT"/prof-$g/*.json; done ;;
layers) echo "== per-layer device time, ${POLICIES:-offload,hybrid}, ${THREADS:-6} threads"
  timeout 200 $DEC --cpu-threads "${THREADS:-6}" --repeats 1 --steps 128 --warmup-tokens 200 --routing-trace $TRACE --runahead \
    --profile-dir "$OUT/prof-layers" --policies ${POLICIES:-offload,hybrid} > "$OUT/layers.log" 2>&1; tail -8 "$OUT/layers.log"
  for f in "$OUT"/prof-layers/*.json; do echo "-- $(basename "$f")"; python3 bench/gpu/timeline.py "$f" --layers
    python3 bench/gpu/timeline.py "$f" --count 40 > "${f%.json}.timeline.txt"; gzip -f "$f"; done ;;
threads16) echo "== hybrid at 14,15,16 CPU threads, CPU batches traced"
  timeout "${DEC_TIMEOUT:-290}" $DEC --cpu-threads ${THREADS16:-14,15,16} --repeats 3 --steps 256 --warmup-tokens 200 --routing-trace $TRACE \
  --measure-bw --runahead --cpu-trace --policies ${POLICIES:-offload,hybrid} --json "$OUT/threads16.json" > "$OUT/threads16.log" 2>&1
  grep -E "^(offload|hybrid|## CPU)|acceptance|online" "$OUT/threads16.log" ;;
cores6) echo "== a 6-core machine (taskset -c 0-5): workers never spin (< 8 cores)"
  for r in 1 2 3; do timeout 120 taskset -c 0-5 $DEC --repeats 1 --steps 256 --warmup-tokens 200 --routing-trace $TRACE \
    --policies ${POLICIES:-offload,hybrid,static-layers} --json "$OUT/cores6_$r.json" > "$OUT/cores6_$r.log" 2>&1
    echo "run $r: $(grep -E '^# runs' "$OUT/cores6_$r.log")"; done ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
