export PYTHONPATH=src PYTHONUNBUFFERED=1
T=.carry/traces/locality-48x128x8.npy
D="python3 -X faulthandler -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --cpu-threads 6 --routing-trace $T"
for g in --no-cuda-graphs --cuda-graphs; do echo "== hybrid+ce+lag $g"
timeout -s ABRT 50 $D --repeats 1 --steps 64 --warmup-tokens 64 --policies hybrid+ce+lag $g > $OUT/diag$g.log 2>&1; echo rc $?
grep -E "tok/s|File|Thread|Error|error" $OUT/diag$g.log | head -40; done
echo "== decode6 A/B"
timeout 280 python3 -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --cpu-threads 6 --repeats 3 --steps 256 --warmup-tokens 200 --routing-trace $T --measure-bw --runahead --policies offload+lag,offload+ce+lag,hybrid+lag,hybrid --json $OUT/ab6.json > $OUT/ab6.log 2>$OUT/ab6.err; cat $OUT/ab6.log
