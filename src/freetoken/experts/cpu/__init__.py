"""The CPU expert kernel: routed experts run in place from the host pool (C++, built on first use).

Import ``freetoken.experts.cpu.kernel`` for ``CpuExpertKernel``; importing this package builds nothing.
"""
