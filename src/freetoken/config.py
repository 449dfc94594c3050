"""Engine settings: one frozen dataclass; field docstrings become ``--help`` text, and each field a command-line
flag (``add_config_args``: the ``ft`` subcommands and the benchmarks' commands call it)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

MOE_BACKENDS = ("auto", "fused", "offload", "cpu", "hybrid")  # the engine's; benchmarks register more
DTYPES = ("float32", "bfloat16", "float16")
PREFILL_ORDERS = ("auto", "layer", "chunk")
VERIFY_WEIGHTS = ("background", "load", "off")
# the values a string field takes (the CLI's choices)
CHOICES = {
    "moe_backend": MOE_BACKENDS, "dtype": DTYPES, "prefill_order": PREFILL_ORDERS, "verify_weights": VERIFY_WEIGHTS,
}  # fmt: skip


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
    """Most tokens one layer-major prefill keeps activations for (longer prompts run in several). None: one whole
    context, as far as the memory plan has room; 0: chunk-major always."""
    prefill_interleave_ms: float = 40.0
    """While a layer-major prefill runs, other running requests get a decode step at least this often."""
    page_size: int = 16
    """Tokens per KV page."""
    kv_pages: int | None = None
    """KV pages to allocate. None: the memory plan's (what the expert slots leave, up to max_model_len x running)."""
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
    """GiB of device memory for the expert-slot cache, the KV pages and the reserve (the weights, recurrent states,
    state checkpoints and layer-major activations of the memory plan come on top), split by the memory planner and
    resized at run time (``ft ctl memory``); the split then follows the session (the fused backend keeps every expert
    on the device: there the budget sizes the KV pages). None: the memory plan sizes the caches from the free device
    memory (``ft serve`` prints it)."""
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
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1 (omit it for the physical cores - 1), got {self.cpu_threads}")
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


# -- command-line flags ---------------------------------------------------------------------------------------------
# A field is ``--field-name`` (a trailing ``_s``, seconds, dropped: ``SECONDS``); an int or float field parses as
# one; a bool field that defaults to True is ``--no-field-name``, to False ``--field-name``, to None both; a tuple
# field takes a comma list; a string field's choices come from ``CHOICES``. ``FLAGS`` spells the others.


def expert_cache_arg(value: str) -> int | float:
    """``N`` slots or a fraction ``F`` in (0, 1]."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a slot count or a fraction, got {value!r}") from None


def comma_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class Flag:
    """A field's flag where the rule above does not spell it."""

    name: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # the argparse ``type``
    nargs: str | None = None  # a list on the command line (its default None: the field's)
    action: type[argparse.Action] | None = None
    consts: tuple[tuple[str, str, str], ...] = ()  # (flag, value, help): store_const flags instead of one


_GIB = Flag(metavar="GIB")
FLAGS: dict[str, Flag] = {  # EngineConfig's and ServerConfig's (server/settings.py) fields, by name
    "expert_cache": Flag(metavar="N|F", parse=expert_cache_arg),
    "vram_budget": _GIB,
    "vram_reserve": _GIB,
    "pinned_budget": _GIB,
    "state_checkpoint_gib": _GIB,
    "state_checkpoint_host_gib": _GIB,
    "state_checkpoint_every": Flag(metavar="TOKENS"),
    "verify_weights": Flag(consts=(
        ("--verify", "load", "FTW checkpoints: check every checksum before serving (default: in the background once "
                             "serving starts)"),
        ("--no-verify", "off", "FTW checkpoints: do not check the checksums"),
    )),  # fmt: skip
    "served_model_names": Flag(name="--served-model-name", metavar="NAME", nargs="+"),
    "allowed_hosts": Flag(metavar="HOST,..."),
    "cors_origins": Flag(metavar="ORIGIN,..."),
}
FIELDS_KEY = "_config_fields"  # the parser default naming the fields that got flags


def flag_name(field: str, flags: dict[str, Flag] = FLAGS) -> str:
    spelled = flags.get(field)
    return spelled.name if spelled and spelled.name else "--" + field.removesuffix("_s").replace("_", "-")


def add_config_args(
    p: argparse.ArgumentParser, cls: type, skip: Collection[str] = (), only: Collection[str] | None = None,
    defaults: dict[str, Any] | None = None, flags: dict[str, Flag] = FLAGS,
) -> None:  # fmt: skip
    """One flag per field of ``cls`` (but ``skip``; only ``only`` when given), ``defaults`` replacing the field's."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    added = set()
    for f in dataclasses.fields(cls):
        if f.name in skip or (only is not None and f.name not in only):
            continue
        default = (defaults or {}).get(f.name, f.default)
        doc = docs.get(f.name, "").replace("%", "%%")
        _add_flag(p, f.name, _base_type(hints[f.name]), default, doc, flags.get(f.name, Flag()), flags)
        added.add(f.name)
    p.set_defaults(**{FIELDS_KEY: frozenset(p.get_default(FIELDS_KEY) or ()) | added})


def _base_type(t: Any) -> Any:
    """A field's type without None: ``int | None`` -> int; ``int | float | None`` -> (int, float)."""
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return args[0] if len(args) == 1 else tuple(args)
    return t


OFF_HELP = "turns off (on by default): "  # the help of a --no-X flag, before what X does


def _add_flag(
    p: argparse.ArgumentParser, name: str, base: Any, default: Any, doc: str, sp: Flag, flags: dict[str, Flag]
) -> None:
    for i, (const_flag, value, text) in enumerate(sp.consts):  # the first carries the default
        p.add_argument(const_flag, dest=name, action="store_const", const=value, help=text,
                       **({} if i else {"default": default}))  # fmt: skip
    if sp.consts:
        return
    flag = flag_name(name, flags)
    if base is bool:
        if default is None:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=doc)
        else:
            plain, doc = ("--no-" + flag.removeprefix("--"), OFF_HELP + doc) if default else (flag, doc)
            p.add_argument(plain, dest=name, action="store_false" if default else "store_true", help=doc)
        return
    metavar = sp.metavar or ("SECONDS" if name.endswith("_s") else None)
    kw: dict[str, Any] = {"dest": name, "default": default, "help": doc, "metavar": metavar}
    if sp.nargs:
        kw.update(nargs=sp.nargs, default=None)
    elif typing.get_origin(base) is tuple:
        kw["type"] = comma_list
    elif sp.parse or base in (int, float):
        kw["type"] = sp.parse or base
    if sp.action:
        kw["action"] = sp.action
    elif name in CHOICES:
        kw["choices"] = CHOICES[name]
    p.add_argument(flag, **kw)


def config_kwargs(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The parsed values of ``cls``'s flags as keyword arguments; a None where the field's default is not None is left
    out (a flag whose default is "the engine's")."""
    names: frozenset[str] = getattr(args, FIELDS_KEY, frozenset())
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in names:
            value = getattr(args, f.name)
            if isinstance(f.default, tuple):
                value = tuple(value or ())
            if value is not None or f.default is None:
                kw[f.name] = value
    return kw


Config = TypeVar("Config")


def config_from_args(cls: type[Config], args: argparse.Namespace, **changes: Any) -> Config:
    """``cls`` from the parsed flags (``add_config_args``), with ``changes`` on top."""
    return cls(**config_kwargs(cls, args) | changes)
