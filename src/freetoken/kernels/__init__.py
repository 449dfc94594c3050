"""Kernels: one dispatch point per op (the torch reference, Triton, C++, chosen by device and availability), the
attention-backend registry, and the Triton and C++ build helpers. Knows nothing of models, layers or experts.

Ops: ``linear`` (bf16 weight copies for float32 CPU steps), ``norm`` (RMSNorm family), ``route`` (router softmax +
top-k), ``gated_delta`` (the gated delta rule, its decode step), ``attention`` (paged attention backends). Builds:
``triton_support`` (``use_triton``, ticket counters), ``build`` (C++ libraries on first use), ``cpu_step`` (the CPU
decode step's C++ ops).
"""
