"""Route codes of queued CPU batches (``FtQueuedArgs::codes``): which routes run here, on which pool row,
and from which intermediate row on.

``c >= 0``: the route does not run on the CPU (the GPU's slot id, or anything). ``c < 0``: with
``v = -1 - c`` it runs here on pool row ``v % N`` over intermediate rows ``[v // N, I)`` (N pool rows;
``v < N``, i.e. ``c = -1 - row``, is the whole expert: the encoding before experts were split). The
hybrid backend splits one expert per layer step by intermediate rows: the GPU computes ``[0, c)``, the
CPU ``[c, I)``, and the partial sums add up to the expert's output.
"""

from __future__ import annotations

from typing import overload

import torch

__all__ = ["decode_codes", "encode_code"]


@overload
def encode_code(row: int, i_begin: int, num_rows: int) -> int: ...


@overload
def encode_code(row: torch.Tensor, i_begin: torch.Tensor | int, num_rows: int) -> torch.Tensor: ...


def encode_code(row: int | torch.Tensor, i_begin: int | torch.Tensor, num_rows: int) -> int | torch.Tensor:
    """The code of a CPU route on pool row ``row`` (in [0, N)) computing intermediate rows [i_begin, I).

    Ints or int64 tensors (elementwise, on any device: no host synchronisation).
    """
    return -1 - (i_begin * num_rows + row)


def decode_codes(codes: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``codes`` int64 [K] -> (mine bool [K]: runs here, rows int64 [M], i_begin int32 [M]) for the M
    routes with ``mine``, in route order: the ``row`` and ``i_begin`` arguments of
    ``CpuExpertKernel.submit``. Data-dependent shapes: a host-side helper."""
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    mine = codes < 0
    v = -1 - codes[mine]
    return mine, torch.remainder(v, num_rows), torch.div(v, num_rows, rounding_mode="floor").to(torch.int32)
