"""The CPU expert kernel's C++ sources (this folder), as ``kernels/build.py`` builds them: the core units, one unit per
x86 ISA path with its own ``-m`` flags, and ``kernel.cpp`` (the run-time dispatch) compiled last with the macros of
the ISA paths that built."""

from __future__ import annotations

from pathlib import Path

from freetoken.kernels.build import AVX2_FLAGS, AVX512_FLAGS, CppLibrary

CPU_EXPERTS = CppLibrary(
    name="cpu_experts",
    src_dir=Path(__file__).resolve().parent,
    lib_name="libft_cpu_experts.so",
    headers=(
        "kernel_api.h", "plan.h", "workers.h", "feeder.h", "job_queue.h", "relax.h", "flag_wait.h", "dot_impl.h",
        "dot_rows.h", "dot_formats.h", "dot_fp4_dp.h", "dot_fp4_avx2.h", "dot_fp4_avx2i.h", "dot_fp4_avx512.h",
        "dot_fp4_scales512.h", "isa_avx2_s.h", "isa_avx512_s.h", "isa_avx2.h", "isa_avx2vnni.h", "isa_avx512.h",
        "isa_avx512vbmi.h", "isa_avx512bf16.h",
    ),  # fmt: skip
    core_sources=("kernel.cpp", "plan.cpp", "workers.cpp", "feeder.cpp", "isa_generic.cpp"),
    dispatch_source="kernel.cpp",
    isa_sources={
        "isa_avx2.cpp": (AVX2_FLAGS, "FT_HAVE_AVX2"),
        "isa_avx2vnni.cpp": ((*AVX2_FLAGS, "-mavxvnni"), "FT_HAVE_AVX2VNNI"),
        "isa_avx512.cpp": (AVX512_FLAGS, "FT_HAVE_AVX512"),
        "isa_avx512vbmi.cpp": ((*AVX512_FLAGS, "-mavx512vbmi", "-mavx512vnni"), "FT_HAVE_AVX512VBMI"),
        "isa_avx512bf16.cpp": ((*AVX512_FLAGS, "-mavx512bf16"), "FT_HAVE_AVX512BF16"),
    },
)
