#!/usr/bin/env bash
# GPU box check of the experts/ reshape (issue 18): the GPU tests still pass and decode is as fast as before.
#
# Prepare .carry/ once, on this machine, from the repository root (.carry/ is git-ignored):
#   mkdir -p .carry/traces .carry/old && cp ../shared/traces/locality-48x128x8.npy .carry/traces/
#   git archive 9219bb3 src ':(exclude)src/freetoken/assets' | tar -x -C .carry/old   # the old tree: .carry/old/src
# and name both in the run's carry: [".carry/traces", ".carry/old"]  (about 1.7 MB).
#
# Stages (default: both, ~14 min: more than one device call, so run them as two calls):
#   tests   (~6 min) bench/gpu/experts.sh tests (every GPU test), bench/gpu/prefill.sh, bench/gpu/engine_core.sh
#   decode  (~7 min) the CPU kernel's tests on this CPU (its AVX-512-BF16 path: the dev box has none), then
#           ft bench decode at 6 and 16 threads on the replayed trace, offload and hybrid, the old tree
#           (9219bb3, .carry/old/src) and the new one in alternating processes, 3 each; a table of medians
#           and the ratio new / old last (target: within ±5%)
# Logs under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TRACE=.carry/traces/locality-48x128x8.npy
ARGS="--preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --routing-trace $TRACE --steps 256 --warmup-tokens 200"
ARGS="$ARGS --cpu-threads 6,16 --repeats 1 --policies offload,hybrid"
for stage in ${*:-tests decode}; do case $stage in
tests)
  OUT=$OUT bash bench/gpu/experts.sh tests
  OUT=$OUT bash bench/gpu/prefill.sh
  OUT=$OUT bash bench/gpu/engine_core.sh | tail -4 ;;
decode)
  [ -f "$TRACE" ] && [ -d .carry/old/src/freetoken ] || { echo "prepare .carry/ first (see the top of $0)"; exit 2; }
  echo "== CPU kernel tests on this CPU"
  PYTHONPATH=src timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kernel.py \
    tests/test_cpu_kernel_queue.py > "$OUT/cpu_kernel_tests.log" 2>&1; tail -1 "$OUT/cpu_kernel_tests.log"
  grep -E "^(FAILED|ERROR)" "$OUT/cpu_kernel_tests.log" | head -10
  echo "== ft bench decode, old (9219bb3) and new alternating, 3 each"
  PYTHONPATH=.carry/old/src python3 -c "import freetoken.experts.share_split" 2>/dev/null \
    && ! PYTHONPATH=src python3 -c "import freetoken.experts.share_split" 2>/dev/null \
    || { echo ".carry/old/src is not the 9219bb3 tree (or src is not the new one)"; exit 2; }
  for r in 1 2 3; do for tree in old new; do
    src=src; [ $tree = old ] && src=.carry/old/src
    PYTHONPATH=$src timeout 140 python3 -m freetoken.bench.decode $ARGS --json "$OUT/decode_${tree}_$r.json" \
      > "$OUT/decode_${tree}_$r.log" 2> "$OUT/decode_${tree}_$r.err" || echo "$tree run $r failed: $(tail -1 "$OUT/decode_${tree}_$r.err")"
    echo "$tree $r: $(grep -E 'rep 0' "$OUT/decode_${tree}_$r.err" | sed 's/.*threads //' | tr '\n' ';')"
  done; done
  # "#   threads 6 rep 0: hybrid 181.0 tok/s" lines (stderr, the same in both trees) -> medians and new / old
  python3 - "$OUT" <<'EOF'
import glob, re, statistics, sys
runs = {}
for path in glob.glob(f"{sys.argv[1]}/decode_*_*.err"):
    tree = path.rsplit("/", 1)[1].split("_")[1]
    for m in re.finditer(r"threads (\d+) rep \d+: (\S+) ([\d.]+) tok/s", open(path).read()):
        runs.setdefault((int(m[1]), m[2], tree), []).append(float(m[3]))
print("| threads | policy | old tok/s (runs) | new tok/s (runs) | new / old |\n|---|---|---|---|---|")
for t, p in sorted({(t, p) for t, p, _ in runs}):
    old, new = runs.get((t, p, "old"), []), runs.get((t, p, "new"), [])
    mo, mn = (statistics.median(v) if v else float("nan") for v in (old, new))
    shown = [f"{m:.1f} ({', '.join(f'{v:.1f}' for v in vs)})" for m, vs in ((mo, old), (mn, new))]
    print(f"| {t} | {p} | {shown[0]} | {shown[1]} | {mn / mo:.3f} |")
EOF
  ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
