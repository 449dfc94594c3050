"""The expert-slot cache: tables, the per-layer device plan, fills and the grouped GEMM over slots; each torch
version beside its Triton kernel."""
