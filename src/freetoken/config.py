"""Engine settings: one frozen dataclass; field docstrings become ``--help`` text."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any

MOE_BACKENDS = ("auto", "fused", "offload", "cpu", "hybrid", "static-layers", "static-freq")
VERIFY_WEIGHTS = ("background", "load", "off")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None
    """Checkpoint directory (Hugging Face layout). None: the embedded default model."""
    device: str | None = None
    """Compute device: "cpu", "cuda" or "cuda:N". None: cuda when available, else cpu."""
    dtype: str | None = None
    """Compute dtype name ("float32", "bfloat16", "float16"). None: bfloat16 on GPU, float32 on CPU."""
    moe_backend: str = "auto"
    """Where routed experts run: auto, fused, offload, cpu, hybrid (see docs/architecture.md)."""
    expert_cache: int | float | None = None
    """Expert-slot cache size: a slot count (int) or a fraction of the pool (float in (0, 1])."""
    fill_fraction: float | None = None
    """Fixed share of cache misses to copy into the cache (the rest run on the CPU). None: measured split."""
    max_running_requests: int = 4
    """Requests decoded together; later ones wait in the queue."""
    max_queued_requests: int = 256
    """Requests that may wait; beyond this new requests are refused."""
    max_batched_tokens: int = 8192
    """Tokens computed in one step (prefill chunk size plus running decodes)."""
    prefill_order: str = "auto"
    """A prompt spanning several chunks: "layer" runs every chunk of a layer, then the next layer (a cold prompt
    streams the expert pool once); "chunk" runs each chunk through all layers; "auto": layer where the MoE
    backend streams whole layers through its slot cache."""
    layer_major_tokens: int | None = None
    """Most tokens one layer-major prefill keeps activations for (longer prompts run in several). None: as
    half the free memory allows; 0: chunk-major always."""
    prefill_interleave_ms: float = 40.0
    """While a layer-major prefill runs, other running requests get a decode step at least this often."""
    page_size: int = 16
    """Tokens per KV page."""
    kv_pages: int | None = None
    """KV pages to allocate. None: derived from the memory budget (CPU: enough for max_model_len x running)."""
    prefix_cache: bool = True
    """Reuse the KV of prompt prefixes computed before (radix tree over KV pages, shared by all requests)."""
    state_checkpoints: int | None = None
    """Models with linear-attention layers: recurrent-state checkpoints kept for prefix reuse (taken at the
    special tokens where agents edit the context, and at prompt ends); 0: no prefix reuse for them. None: as many
    as fit in ``state_checkpoint_gib``, at least 16 and at most 256."""
    state_checkpoint_gib: float = 1.0
    """Device memory for those checkpoints when their number is not given."""
    state_checkpoint_host_gib: float | None = None
    """Host RAM (pinned on a GPU) for a second tier of those checkpoints: the ones the device tier evicts (least
    recently used) move there, and a request resumes from one by copying it back. None: an eighth of the RAM free
    once the model is loaded, at most 8 GiB (and 1024 checkpoints); 0: no host tier (evicted checkpoints are
    dropped)."""
    state_checkpoint_every: int | None = None
    """Where those checkpoints are taken. None: at the model's special-token anchors (and prompt ends); N: on a
    fixed grid every N tokens (and prompt ends) instead, like llama.cpp's --checkpoint-every-nb (for comparison)."""
    max_model_len: int | None = None
    """Context length limit. None: the checkpoint's max_position_embeddings."""
    cpu_threads: int | None = None
    """Threads computing CPU experts: the kernel's workers plus the thread that runs each batch and takes
    work units too (so ``cpu_threads - 1`` workers, at least 1). None: physical cores - 1."""
    moe_cuda_graphs: bool = True
    """Replay each MoE layer's decode step as a CUDA graph (on CUDA; False: eager). Without graphs the
    host's launches, not the device, set the decode pace."""
    cuda_graphs: bool = True
    """Replay each decode step whole (model, MoE layers, sampling) as one CUDA graph per batch-size bucket
    (on CUDA; False: eager steps, with the MoE layers' own graphs)."""
    overlap_steps: bool | None = None
    """Launch decode step N+1 (its input ids taken from step N's samples on the device) before the host reads
    step N's tokens, so the host's work for a step hides behind the device's (``engine/overlap.py``); outputs
    stay the serial step's. None: on a CUDA device; True / False: always / never (a CPU device computes each
    step as it is launched, so there it only exercises the same bookkeeping)."""
    vram_budget: float | None = None
    """GiB of device memory for the expert-slot cache, the KV pages and the reserve (the other weights come on
    top), split by the memory planner and resized at run time (``ft ctl memory``); the split then follows the
    session (the fused backend keeps every expert on the device: there the budget sizes the KV pages). None: the
    sizes of expert_cache and kv_pages."""
    vram_reserve: float = 1.0
    """GiB of the budget left free for activations and graphs; the VRAM watcher keeps this much free."""
    vram_watch: bool = True
    """On CUDA, watch the device's free memory (NVML, ``nvidia-ml-py``) and shrink the caches when other
    programs take it, growing back when they free it."""
    pinned_budget: float | None = None
    """GiB of the host expert pool to page-lock, for systems that cap pinned memory (WSL: about half the RAM).
    Experts beyond it stay pageable and run on the CPU branch, never copied to the GPU (hybrid backend).
    None: pin the whole pool."""
    seed: int = 0
    """Seed for requests that set none."""
    verify_weights: str = "background"
    """FTW checkpoints: check the files' checksums in the background once serving starts ("background"), before
    serving ("load": a corrupt file is refused) or never ("off")."""

    def __post_init__(self) -> None:
        if self.verify_weights not in VERIFY_WEIGHTS:
            raise ValueError(f"verify_weights must be one of {', '.join(VERIFY_WEIGHTS)}, got {self.verify_weights!r}")
        if self.moe_backend not in MOE_BACKENDS:
            raise ValueError(f"moe_backend must be one of {', '.join(MOE_BACKENDS)}, got {self.moe_backend!r}")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.state_checkpoints is not None and self.state_checkpoints < 0:
            raise ValueError("state_checkpoints must be >= 0")
        if not self.state_checkpoint_gib >= 0:
            raise ValueError("state_checkpoint_gib must be >= 0")
        if self.state_checkpoint_host_gib is not None and not self.state_checkpoint_host_gib >= 0:
            raise ValueError(f"state_checkpoint_host_gib must be >= 0 (0: no host tier), got "
                             f"{self.state_checkpoint_host_gib}")  # fmt: skip
        if self.state_checkpoint_every is not None and self.state_checkpoint_every < 1:
            raise ValueError(f"state_checkpoint_every must be >= 1 token, got {self.state_checkpoint_every}")
        if self.max_batched_tokens < 1:
            raise ValueError("max_batched_tokens must be >= 1")
        if self.prefill_interleave_ms < 0:
            raise ValueError("prefill_interleave_ms must be >= 0")
        if self.page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2 (a prompt token and a reply), got {self.max_model_len}")
        ec = self.expert_cache
        if isinstance(ec, float) and not (0.0 < ec <= 1.0):
            raise ValueError(f"expert_cache as a fraction must be in (0, 1], got {ec}")
        if isinstance(ec, int) and not isinstance(ec, bool) and ec < 0:
            raise ValueError(f"expert_cache as a slot count must be >= 0, got {ec}")
        if self.vram_budget is not None and not self.vram_budget > 0:
            raise ValueError(f"vram_budget must be a positive number of GiB, got {self.vram_budget}")
        if not self.vram_reserve >= 0:
            raise ValueError(f"vram_reserve must be >= 0 GiB, got {self.vram_reserve}")
        if self.pinned_budget is not None and not self.pinned_budget >= 0:
            raise ValueError(f"pinned_budget must be >= 0 GiB, got {self.pinned_budget}")
        if self.fill_fraction is not None and not (0.0 <= self.fill_fraction <= 1.0):
            raise ValueError(f"fill_fraction must be in [0, 1], got {self.fill_fraction}")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Env:
    """The only environment variables FreeToken reads, read once per process (``env()``)."""

    cache_dir: str
    """Where built kernels and machine profiles are kept (FREETOKEN_CACHE, an absolute path or one starting with
    ``~``; default ~/.cache/freetoken). Empty or relative is refused: it would build into the working directory."""
    debug: bool
    """Check cache invariants after every step (FREETOKEN_DEBUG=1)."""
    fla: bool
    """Gated DeltaNet layers on CUDA use flash-linear-attention's kernels where importable (FREETOKEN_FLA=0: off)."""

    @classmethod
    def read(cls) -> Env:
        """Raises ``ValueError`` (one line naming the variable) for a value FreeToken cannot use."""
        return cls(cache_dir=_cache_dir(os.environ.get("FREETOKEN_CACHE")),
                   debug=os.environ.get("FREETOKEN_DEBUG", "") == "1",
                   fla=os.environ.get("FREETOKEN_FLA", "1") != "0")  # fmt: skip


def _cache_dir(value: str | None) -> str:
    if value is None:
        return os.path.join(os.path.expanduser("~"), ".cache", "freetoken")
    path = os.path.expanduser(value)
    if not os.path.isabs(path):
        raise ValueError(
            f"FREETOKEN_CACHE must be an absolute directory path (where built kernels and machine profiles are "
            f"kept), got {value!r}; unset it for ~/.cache/freetoken"
        )
    return path


@functools.cache
def env() -> Env:
    """The process's ``Env`` (tests that change the variables call ``env.cache_clear()``)."""
    return Env.read()


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (they become ``--help`` text)."""
    docs: dict[str, str] = {}
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        doc = nxt.value if isinstance(nxt, ast.Expr) else None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(doc, ast.Constant):
            docs[node.target.id] = str(doc.value)
    return docs
