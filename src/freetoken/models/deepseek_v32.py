"""DeepSeek-V3.2 (``DeepseekV32ForCausalLM``): DeepSeek-V3 (``deepseek_v3.py``) with DeepSeek sparse attention in
every layer (``layers/dsa.py``: a lightning indexer picks each query's ``index_topk`` positions; its rotary is
rotate-half). The multi-token-prediction layer stored after the decoder's is not used."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("DeepseekV32ForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    attention="dsa",
    routing="sigmoid",
    mtp_keys=("num_nextn_predict_layers", "num_mtp_layers"),
)
