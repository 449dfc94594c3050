"""GLM-5 (``GlmMoeDsaForCausalLM``): DeepSeek-V3.2's sparse attention (``layers/dsa.py``) whose indexer rotates in the
interleaved layout (permuted at load, ``models/dsa_blocks.py``), on GLM's layer plan; layers without an indexer of
their own attend by the last indexer layer's top-k (``indexer_types`` "shared", or ``index_topk_freq``). The
multi-token-prediction layer is not used."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("GlmMoeDsaForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    attention="dsa",
    routing="sigmoid",
    mtp_keys=("num_nextn_predict_layers", "num_mtp_layers"),
    indexer_rope_interleave=True,
    indexer_sharing=True,
)
