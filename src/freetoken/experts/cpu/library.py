"""The C++ expert kernel's shared library, loaded once through ctypes with every entry point's signature, and the ISA
paths it can be built with (``ISAS``: index = the C enum value)."""

from __future__ import annotations

import ctypes
import functools
import warnings

from freetoken.experts.cpu.args import MoeArgs, QueuedArgs

ISAS = ("generic", "avx2", "avx2vnni", "avx512", "avx512vbmi", "avx512bf16")


@functools.lru_cache(maxsize=1)
def load_library() -> ctypes.CDLL | None:
    """The built kernel library, or None (warned once) when it cannot be built here."""
    from freetoken.experts.cpu.sources import CPU_EXPERTS
    from freetoken.kernels.build import BuildError, library_path

    try:
        lib = ctypes.CDLL(str(library_path(CPU_EXPERTS)))
    except (BuildError, OSError) as exc:
        warnings.warn(f"CPU expert kernel unavailable, using the torch fallback: {exc}", stacklevel=2)
        return None
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.ft_isa_supported.argtypes, lib.ft_isa_supported.restype = [i32], i32
    lib.ft_best_isa.argtypes, lib.ft_best_isa.restype = [], i32
    lib.ft_pool_create.argtypes, lib.ft_pool_create.restype = [i32, vp, i32, i32], vp
    lib.ft_pool_destroy.argtypes, lib.ft_pool_destroy.restype = [vp], None
    lib.ft_pool_set_rows.argtypes, lib.ft_pool_set_rows.restype = [vp, i64, i64], i32
    lib.ft_moe_submit.argtypes, lib.ft_moe_submit.restype = [vp, ctypes.POINTER(MoeArgs)], i32
    lib.ft_wait.argtypes, lib.ft_wait.restype = [vp, i32], None
    lib.ft_moe_run_inline.argtypes, lib.ft_moe_run_inline.restype = [vp, ctypes.POINTER(MoeArgs)], i32
    lib.ft_moe_enqueue.argtypes, lib.ft_moe_enqueue.restype = [vp, ctypes.POINTER(QueuedArgs)], i32
    lib.ft_moe_enqueue_many.argtypes, lib.ft_moe_enqueue_many.restype = [vp, vp, vp, i64], i32
    lib.ft_queue_drain.argtypes, lib.ft_queue_drain.restype = [vp], None
    lib.ft_queue_pending.argtypes, lib.ft_queue_pending.restype = [vp], i64
    lib.ft_queue_error.argtypes, lib.ft_queue_error.restype = [vp], i32
    lib.ft_queue_trace_fields.argtypes, lib.ft_queue_trace_fields.restype = [], i32
    lib.ft_queue_trace.argtypes, lib.ft_queue_trace.restype = [vp, i64], None
    lib.ft_queue_take_trace.argtypes, lib.ft_queue_take_trace.restype = [vp, vp, i64], i64
    lib.ft_stream_read.argtypes, lib.ft_stream_read.restype = [vp, vp, i64], ctypes.c_uint64
    return lib


def best_isa() -> str:
    """The best ISA path this CPU and build support ("generic" without the library)."""
    lib = load_library()
    return ISAS[lib.ft_best_isa()] if lib is not None else "generic"


def isa_supported(isa: str) -> bool:
    """Whether this CPU and build run the ISA path ``isa`` (one of ``ISAS``)."""
    lib = load_library()
    return lib is not None and bool(lib.ft_isa_supported(ISAS.index(isa)))
