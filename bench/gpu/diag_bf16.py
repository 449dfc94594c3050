"""Diagnose bf16 CUDA vs bf16 CPU per sublayer on a tiny checkpoint (family as argv[1])."""

import sys
import tempfile

import torch

sys.path[:0] = ["tests", "src"]
from freetoken import LLM  # noqa: E402
from freetoken.kernels.norm import rms_norm  # noqa: E402
from tiny_models import save_checkpoint  # noqa: E402

fam = sys.argv[1] if len(sys.argv) > 1 else "mixtral"
d = tempfile.mkdtemp()
save_checkpoint(fam, d, seed=1)
p = [5, 77, 100, 300, 9]
runs = {}
for dev in ["cpu", "cuda"]:
    llm = LLM(model=d, device=dev, dtype="bfloat16")
    eng = llm.engine
    from freetoken.engine.detokenizer import IncrementalDetokenizer
    from freetoken.engine.request import Request
    from freetoken.runner.sampling_params import SamplingParams

    pages = eng.kv.allocate(1, "x")
    req = Request("x", p, SamplingParams(), 10, IncrementalDetokenizer(None, [], [], True))
    req.pages = pages
    ids, batch, _ = eng.runner.build_batch([(req, len(p))])
    m = eng.runner.model
    h = torch.nn.functional.embedding(ids, m.embed)
    trace = []
    for layer in m.layers:
        a = layer.attn.forward(rms_norm(h, layer.attn_norm, m.eps), batch, eng.kv)
        trace.append(("attn", a.float().cpu()))
        h = h + a
        x = rms_norm(h, layer.ffn_norm, m.eps)
        if hasattr(layer.ffn, "route"):
            ids_, w_ = layer.ffn.route(x)
            trace.append(("route_ids", ids_.cpu().float()))
            trace.append(("route_w", w_.cpu()))
            y = layer.ffn.backend.forward(layer.ffn.moe_index, x, ids_, w_)
        else:
            y = layer.ffn.forward(x)
        trace.append(("ffn", y.float().cpu()))
        h = h + y
    runs[dev] = trace
for (n, a), (_, b) in zip(runs["cpu"], runs["cuda"]):
    print(f"{n:10s} max|cpu|={float(a.abs().max()):.3g}  max|cpu-cuda|={float((a-b).abs().max()):.3g}")
