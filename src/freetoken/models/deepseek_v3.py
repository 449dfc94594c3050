"""DeepSeek-V3 (and V3.1, R1: the same architecture): multi-head latent attention (``layers/mla.py``), sigmoid routing
with a correction bias, group limits and a routed scaling factor, the first ``first_k_dense_replace`` layers dense,
shared experts. The multi-token-prediction layer stored after the decoder's (``model.layers.61``) is not used."""

from freetoken.models.base import Family, Naming

FAMILY = Family(
    architectures=("DeepseekV3ForCausalLM",),
    naming=Naming(shared_expert="shared_experts."),
    attention="mla",
    routing="sigmoid",
    mtp_keys=("num_nextn_predict_layers", "num_mtp_layers"),
)
