"""The host's share of an overlapped decode step on a CPU device: what overlap hides behind the device's step on a GPU.

    PYTHONPATH=src python3 bench/overlap_host.py [--batch 1,4] [--steps 200]

Per decode step (cProfile, the embedded default model, greedy, overlap on): the whole ``LLMEngine.step``, the model
and sampler (``ModelRunner.launch``: the device's work on a GPU), and the rest: reading and appending the step's tokens
(detokenize, stop checks) and preparing the next launch (its pages, its metadata).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

from freetoken import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    llm = LLM(device="cpu", max_running_requests=8, overlap_steps=True)
    eng = llm.engine
    for b in (int(x) for x in args.batch.split(",")):
        params = SamplingParams(temperature=0.0, max_tokens=args.steps + 20, ignore_eos=True)
        for i in range(b):
            eng.add_request(f"b{b}-{i}", [100 + i, 200, 300, 400 + i], params)
        for _ in range(10):
            eng.step()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            eng.step()
        prof.disable()
        while eng.has_unfinished():
            eng.step()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        cum = {f"{k[2]}@{k[0].rsplit('/', 1)[-1]}": v[3] for k, v in stats.items()}
        per = {k: 1e6 * cum.get(k, 0.0) / args.steps for k in
               ("step@engine.py", "launch@runner.py", "append_all@engine.py", "_chain@overlap.py")}  # fmt: skip
        host = per["step@engine.py"] - per["launch@runner.py"]
        print(f"batch {b}: step {per['step@engine.py']:.0f} us, model + sampler {per['launch@runner.py']:.0f} us, "
              f"host {host:.0f} us (appending {per['append_all@engine.py']:.0f}, the next launch's bookkeeping "
              f"{per['_chain@overlap.py'] - per['launch@runner.py']:.0f}), launched ahead "
              f"{eng.stats()['steps_launched_ahead']}")  # fmt: skip


if __name__ == "__main__":
    main()
