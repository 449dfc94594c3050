"""The one memory planner (pure: no torch, no allocation): the memory measured free + what each cache kind costs ->
expert slots, KV pages, recurrent-state slots and checkpoints (device and host), layer-major activations, reserve.

The engine calls ``plan`` at start (``loader/model_setup.py``: after the non-expert weights are on the device,
before any cache exists) and at every resize (``engine/elastic.py``: a budget set by hand, the VRAM watcher, the
session's split), with or without a VRAM budget.

Shares, in the order they are granted (a device plan that cannot grant the first four refuses, naming the largest):
1. the fixed lines: the weights outside the slot cache (held already) and, with the ``fused`` backend, every expert;
2. one recurrent-state slot per running request (and one for scoring), where the model has linear-attention layers;
3. the fewest expert slots (one layer's top-k, and the cache's scratch slot) and KV pages (one whole context), and
   the reserve (kept free for a step's temporaries and the CUDA graphs);
4. the state checkpoints on the device (``state_checkpoints``, or as many as ``checkpoint_bytes`` holds, within
   MIN/MAX_CHECKPOINTS) and the layer-major activations (one whole context's tokens, or ``layer_major_tokens``),
   each cut to what is left;
5. with a VRAM budget (slots + KV pages + reserve; the lines above come on top): ``split_budget``'s rule, the KV
   pages the caller keeps (``kv_wanted``), the slots the rest up to the pool, the KV pages what the slots leave;
   without one: the slots up to the whole pool, then the KV pages up to one context per running request; what is
   left stays free. On a CPU device (its caches live in host RAM beside the pool) the defaults are a quarter of the
   pool's experts and at most a quarter of the free RAM (4 GiB) of KV pages.
The host tier of state checkpoints takes ``host_checkpoint_bytes`` of host RAM, or an eighth of the RAM free (at most
HOST_DEFAULT_BYTES and HOST_MAX_CHECKPOINTS).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace

from freetoken.memory.budget import GIB, MIB, BudgetError, MemoryFacts, MemorySplit, split_budget

log = logging.getLogger(__name__)

MIN_CHECKPOINTS, MAX_CHECKPOINTS = 16, 256  # device checkpoints when their number is not given
HOST_DEFAULT_BYTES, HOST_MAX_CHECKPOINTS = 8 * GIB, 1024  # the host tier's default: an eighth of the free RAM
CPU_SLOT_FRACTION = 0.25  # a CPU device without a budget: this share of the pool's experts as slots ...
CPU_KV_FRACTION, CPU_KV_MOST = 0.25, 4 * GIB  # ... and KV pages in at most this share of the free RAM, and this


@dataclass(frozen=True)
class Free:
    """What the machine has for the plan: ``device_bytes`` free where the caches live (plus what planned caches hold
    already, on a resize), ``host_bytes`` of host RAM free (the host checkpoint tier)."""

    device_bytes: int
    host_bytes: int
    on_host: bool = False  # the compute device is the CPU: its caches live in host RAM
    where: str = "device memory"


@dataclass(frozen=True)
class CacheSizes:
    """What one unit of each cache costs for this model and backend (``sizes.model_bytes`` gives the per-token and
    per-request bytes from the HF config)."""

    weights_bytes: int  # on the device outside the slot cache, held already (the plan's fixed line)
    slot_bytes: int  # one expert slot (0: the backend has no slot cache)
    min_slots: int  # one layer's top-k
    max_slots: int  # the whole pool
    page_bytes: int  # one KV page, every full-attention layer
    page_size: int
    state_bytes: int = 0  # one recurrent-state slot (a request's or a checkpoint's); 0: no linear-attention layers
    activation_bytes: int = 0  # per token a layer-major pass keeps
    resident_expert_bytes: int = 0  # the ``fused`` backend's experts, all on the device


@dataclass(frozen=True)
class Wants:
    """The user's settings and the caller's fixed counts (None: the plan's choice)."""

    context: int  # tokens of one whole context (max_model_len)
    context_fixed: bool = True  # False: the checkpoint's own limit, which a device without room for it cuts
    max_running: int = 4
    budget_bytes: int | None = None  # a VRAM budget: slots + KV pages + reserve
    reserve_bytes: int = GIB
    slots: int | None = None  # ``expert_cache`` as a count (without a budget)
    kv_pages: int | None = None  # ``kv_pages`` given (without a budget: that many; with one: kept where they fit)
    kv_wanted: int | None = None  # a resize: the KV pages to keep (``follow_kv``, or the pool's size now)
    state_checkpoints: int | None = None
    checkpoint_bytes: int = GIB  # device bytes for checkpoints when their number is not given
    host_checkpoint_bytes: int | None = None  # None: the default host tier; 0: none
    layer_major_tokens: int | None = None
    prefix_cache: bool = True


@dataclass(frozen=True)
class MemoryPlan:
    sizes: CacheSizes
    context: int
    slots: int
    kv_pages: int
    state_slots: int  # request slots (running requests + one for scoring)
    state_checkpoints: int  # device checkpoints
    host_checkpoints: int
    activation_tokens: int
    reserve_bytes: int
    budget_bytes: int | None  # the VRAM budget (slots + KV + reserve) set by hand, None without
    free_bytes: int | None  # what was measured free (None: a resize planned without measuring)
    where: str = "device memory"
    context_cut_from: int | None = None  # the checkpoint's context, where the device had no room for one

    # ---- each share in bytes ---------------------------------------------------------------------------------
    @property
    def slots_bytes(self) -> int:
        """The slots and the slot cache's scratch slot (masked work reads it)."""
        return (self.slots + 1) * self.sizes.slot_bytes if self.slots else 0

    @property
    def kv_bytes(self) -> int:
        return self.kv_pages * self.sizes.page_bytes

    @property
    def states_bytes(self) -> int:
        return (self.state_slots + self.state_checkpoints) * self.sizes.state_bytes

    @property
    def activations_bytes(self) -> int:
        return self.activation_tokens * self.sizes.activation_bytes

    @property
    def host_checkpoints_bytes(self) -> int:
        return self.host_checkpoints * self.sizes.state_bytes

    @property
    def held_bytes(self) -> int:
        """What the engine holds on the device once every cache exists (the activations and the reserve stay free)."""
        s = self.sizes
        return s.weights_bytes + s.resident_expert_bytes + self.slots_bytes + self.kv_bytes + self.states_bytes

    @property
    def planned_bytes(self) -> int:
        return self.held_bytes + self.activations_bytes + self.reserve_bytes

    @property
    def split(self) -> MemorySplit:
        """The part elastic memory resizes: slots + KV pages + reserve."""
        budget = self.slots * self.sizes.slot_bytes + self.kv_bytes + self.reserve_bytes
        return MemorySplit(budget if self.budget_bytes is None else self.budget_bytes, self.slots, self.kv_pages,
                           self.reserve_bytes)  # fmt: skip

    def facts(self, min_pages: int) -> MemoryFacts:
        s = self.sizes
        return MemoryFacts(s.slot_bytes, s.page_bytes, s.min_slots, s.max_slots, min_pages, self.reserve_bytes,
                           s.page_size, self.context)  # fmt: skip

    def lines(self) -> list[tuple[str, str, int]]:
        """(share, count, bytes) in the table's order; held on the device first, then kept free, then host RAM."""
        s, rows = self.sizes, []
        if s.weights_bytes:  # (a CPU engine's weights live in host RAM: not measured)
            rows.append(("weights (outside the slot cache)", "", s.weights_bytes))
        if s.resident_expert_bytes:
            rows.append(("experts (all on the device)", "", s.resident_expert_bytes))
        rows.append(("expert slots", f"{self.slots} (+1 scratch) x {s.slot_bytes / MIB:.2f} MiB", self.slots_bytes))
        rows.append(("KV pages", f"{self.kv_pages} x {s.page_size} tokens", self.kv_bytes))
        if s.state_bytes:
            rows.append(("recurrent states", f"{self.state_slots} x {s.state_bytes / MIB:.2f} MiB",
                         self.state_slots * s.state_bytes))  # fmt: skip
            rows.append(("state checkpoints (device)", str(self.state_checkpoints),
                         self.state_checkpoints * s.state_bytes))  # fmt: skip
        rows.append(("activations (layer-major, kept free)", f"{self.activation_tokens} tokens",
                     self.activations_bytes))  # fmt: skip
        rows.append(("reserve (kept free)", "", self.reserve_bytes))
        if s.state_bytes:
            rows.append(("state checkpoints (host RAM)", str(self.host_checkpoints), self.host_checkpoints_bytes))
        return rows

    def table(self) -> str:
        cut = f", cut from {self.context_cut_from} to fit" if self.context_cut_from is not None else ""
        budget = f"; VRAM budget {self.budget_bytes / GIB:.2f} GiB" if self.budget_bytes is not None else ""
        head = f"memory plan ({self.where}; context {self.context} tokens{cut}{budget})"
        out = [head, f"  {'share':<38} {'count':>24} {'GiB':>9}"]
        out += [f"  {name:<38} {count:>24} {nbytes / GIB:>9.3f}" for name, count, nbytes in self.lines()]
        out.append(f"  {'held on the device':<38} {'':>24} {self.held_bytes / GIB:>9.3f}")
        out.append(f"  {'planned in all (held + kept free)':<38} {'':>24} {self.planned_bytes / GIB:>9.3f}")
        if self.free_bytes is not None:
            left = self.free_bytes + self.sizes.weights_bytes - self.planned_bytes
            out.append(f"  {'left free beyond the plan':<38} {'':>24} {left / GIB:>9.3f}")
        return "\n".join(out)

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: v for k, v in asdict(self).items() if k != "sizes"}
        d["sizes"] = asdict(self.sizes)
        d["shares"] = [{"share": n, "count": c, "bytes": b, "gib": b / GIB} for n, c, b in self.lines()]
        d["held_bytes"], d["planned_bytes"] = self.held_bytes, self.planned_bytes
        return d


def checkpoint_count(state_bytes: int, asked: int | None, budget_bytes: int) -> int:
    """``asked``, or as many checkpoints as ``budget_bytes`` holds (within MIN/MAX_CHECKPOINTS); 0 without states."""
    if not state_bytes:
        return 0
    if asked is not None:
        return asked
    return max(MIN_CHECKPOINTS, min(MAX_CHECKPOINTS, budget_bytes // state_bytes))


def host_checkpoint_count(slot_bytes: int, budget_bytes: int | None, free_bytes: int) -> int:
    """Host-tier checkpoints: as many as ``budget_bytes`` holds; None: an eighth of ``free_bytes`` (at most
    HOST_DEFAULT_BYTES and HOST_MAX_CHECKPOINTS); 0: none. A budget given that holds not one is refused."""
    if budget_bytes == 0 or not slot_bytes:
        return 0
    if budget_bytes is None:
        n = int(min(HOST_DEFAULT_BYTES, free_bytes // 8) // slot_bytes)
        if n < 1:
            log.warning("state checkpoints: no host tier (an eighth of the free RAM, %.0f MiB, holds no %.1f MiB "
                        "checkpoint)", free_bytes / 8 / MIB, slot_bytes / MIB)  # fmt: skip
        return min(n, HOST_MAX_CHECKPOINTS)
    n = budget_bytes // slot_bytes
    if n < 1:
        raise BudgetError(f"state_checkpoint_host_gib={budget_bytes / GIB:.3g} holds no state checkpoint of this model "
                          f"(one is {slot_bytes / MIB:.1f} MiB): give at least {slot_bytes / GIB:.3f} GiB, or 0 for "
                          "no host tier")  # fmt: skip
    return n


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def _refuse(free: Free, needs: list[tuple[str, int]], weights: int) -> BudgetError:
    name, most = max(needs, key=lambda n: n[1])
    total = sum(b for _, b in needs)
    parts = ", ".join(f"{n} {b / GIB:.3f} GiB" for n, b in needs)
    return BudgetError(
        f"the memory plan does not fit: {free.where} has {free.device_bytes / GIB:.3f} GiB free beside the weights "
        f"({weights / GIB:.3f} GiB), and the fewest the engine runs with need {total / GIB:.3f} GiB ({parts}); the "
        f"largest share is {name}, which would need {most / GIB:.3f} GiB (a shorter --max-model-len, fewer "
        f"--max-running-requests or a smaller --vram-reserve lowers it)"
    )


def _needs(s: CacheSizes, w: Wants, state_slots: int, min_pages: int) -> list[tuple[str, int]]:
    """Step 1-3's shares: what the engine cannot run without (given counts where the plan keeps them)."""
    plain = w.budget_bytes is None
    slots = w.slots if plain and s.slot_bytes and w.slots is not None else s.min_slots
    pages = w.kv_pages if plain and w.kv_pages is not None else min_pages
    needs = [("experts (all on the device)", s.resident_expert_bytes),
             ("recurrent states", state_slots * s.state_bytes),
             ("expert slots", (slots + 1) * s.slot_bytes if s.slot_bytes else 0), ("KV pages", pages * s.page_bytes),
             ("reserve", w.reserve_bytes)]  # fmt: skip
    return [(n, b) for n, b in needs if b]


def _extras(s: CacheSizes, w: Wants, left: int | None) -> tuple[int, int]:
    """Step 4: (device checkpoints, activation tokens), each cut to what is ``left`` (None: as ``w`` says)."""
    ckpts = checkpoint_count(s.state_bytes, w.state_checkpoints, w.checkpoint_bytes) if w.prefix_cache else 0
    tokens = w.context if w.layer_major_tokens is None else w.layer_major_tokens
    if left is None:
        return ckpts, tokens
    room = max(left, 0)
    if w.state_checkpoints is None and s.state_bytes:
        ckpts = min(ckpts, room // s.state_bytes)
    room -= ckpts * s.state_bytes
    if w.layer_major_tokens is None and s.activation_bytes:
        tokens = min(tokens, room // s.activation_bytes)
    return ckpts, tokens


def _context_that_fits(s: CacheSizes, w: Wants, left: int, min_pages: int) -> int | None:
    """The longest context (whole pages) whose KV pages fit where one of ``w.context`` does not (``left`` < 0 bytes
    after the fewest of everything); None where the context was set by hand, a budget is given, the KV pages are
    given, or not even one page fits."""
    if w.context_fixed or w.budget_bytes is not None or w.kv_pages is not None or not s.page_bytes:
        return None
    pages = min_pages + left // s.page_bytes  # left < 0: fewer pages
    return pages * s.page_size if pages >= 1 else None


def plan(free: Free | None, sizes: CacheSizes, wants: Wants) -> MemoryPlan:
    """The plan (see the module doc). ``free`` None: a resize inside what the engine holds already (the budget was
    checked against the machine by the caller); the counts of step 4 must then be given in ``wants``."""
    s, w = sizes, wants
    min_pages = _pages(w.context, s.page_size)
    state_slots = w.max_running + 1 if s.state_bytes else 0
    needs = _needs(s, w, state_slots, min_pages)
    left = None if free is None else free.device_bytes - sum(b for _, b in needs)
    if free is not None and left is not None and left < 0 and not free.on_host:
        fits = _context_that_fits(s, w, left, min_pages)
        if fits is None:
            raise _refuse(free, needs, s.weights_bytes)
        log.warning("memory plan: one %d-token context's KV pages do not fit %s: the context is cut to %d tokens "
                    "(--max-model-len sets it)", w.context, free.where, fits)  # fmt: skip
        cut = plan(free, sizes, replace(w, context=fits, context_fixed=True))
        return replace(cut, context_cut_from=w.context)
    ckpts, tokens = _extras(s, w, left)
    if left is not None:
        left -= ckpts * s.state_bytes + tokens * s.activation_bytes
    host = host_checkpoint_count(s.state_bytes, w.host_checkpoint_bytes, free.host_bytes) if free and ckpts else 0
    base = MemoryPlan(s, w.context, 0, 0, state_slots, ckpts, host, tokens, w.reserve_bytes, w.budget_bytes,
                      None if free is None else free.device_bytes, free.where if free else "device memory")  # fmt: skip
    return _split(base, w, free, left, min_pages)


def resize_plan(current: MemoryPlan, budget_bytes: int, kv_wanted: int) -> MemoryPlan:
    """``plan`` for a resize: a new budget for the slots + KV pages + reserve, the other shares as they are."""
    w = Wants(context=current.context, max_running=max(current.state_slots - 1, 1), budget_bytes=budget_bytes,
              reserve_bytes=current.reserve_bytes, kv_wanted=kv_wanted, state_checkpoints=current.state_checkpoints,
              layer_major_tokens=current.activation_tokens)  # fmt: skip
    return replace(plan(None, current.sizes, w), host_checkpoints=current.host_checkpoints, where=current.where)


def _split(base: MemoryPlan, w: Wants, free: Free | None, left: int | None, min_pages: int) -> MemoryPlan:
    """Step 5: the slots and the KV pages."""
    s, budget = base.sizes, base.budget_bytes
    facts = base.facts(min_pages)
    if budget is not None:
        if free is not None and left is not None:
            room = left + facts.minimum_budget
            if budget > room:
                others = "experts kept on the device, recurrent states, checkpoints, activations"
                raise BudgetError(f"a VRAM budget of {budget / GIB:.3f} GiB exceeds what {free.where} has for the "
                                  f"caches: {room / GIB:.3f} GiB beside the weights and the plan's other shares "
                                  f"({others})")  # fmt: skip
        kv = w.kv_wanted if w.kv_wanted is not None else w.kv_pages or min_pages * w.max_running
        split = split_budget(budget, facts, kv)
        return replace(base, slots=split.slots, kv_pages=split.kv_pages)
    wanted_kv = min_pages * w.max_running
    if free is not None and free.on_host:  # the CPU: fixed shares of the pool and of the free RAM
        slots = min(s.max_slots, max(round(CPU_SLOT_FRACTION * s.max_slots), s.min_slots)) if s.slot_bytes else 0
        slots = w.slots if w.slots is not None and s.slot_bytes else slots
        cap = min(CPU_KV_MOST, int(free.device_bytes * CPU_KV_FRACTION)) // max(s.page_bytes, 1)
        kv = w.kv_pages if w.kv_pages is not None else max(1, min(wanted_kv, cap))
        return replace(base, slots=slots, kv_pages=kv)
    if w.kv_wanted is not None or left is None:  # a resize without a budget (never asked today): keep the KV pages
        kv = w.kv_wanted if w.kv_wanted is not None else w.kv_pages or min_pages
        return replace(base, slots=w.slots or s.min_slots, kv_pages=kv)
    kv = w.kv_pages if w.kv_pages is not None else min_pages
    slots = 0
    if s.slot_bytes:
        slots = w.slots if w.slots is not None else min(s.max_slots, s.min_slots + left // s.slot_bytes)
        left -= (slots - s.min_slots) * s.slot_bytes if w.slots is None else 0
    if w.kv_pages is None:  # the KV pages what the slots leave, up to one context per running request
        kv = min(wanted_kv, min_pages + max(left, 0) // s.page_bytes) if s.page_bytes else wanted_kv
    return replace(base, slots=int(slots), kv_pages=int(kv))
