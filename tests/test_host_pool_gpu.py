"""Page-locking the expert pool in place on CUDA: a refused registration leaves no CUDA error behind."""

from __future__ import annotations

import pytest
import torch

from freetoken.experts import host_pool

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_refused_registration_does_not_fail_the_next_kernel() -> None:
    """A range that overlaps one already registered is refused (cudaErrorHostMemoryAlreadyRegistered). The refusal
    used to stay the runtime's last error, raised by torch's check after the next, unrelated kernel launch (a slot
    cache's zero-fill in the GPU run of test_backends). Two ranges sharing a page but not bytes were refused by older
    drivers and are accepted by driver 580 (CUDA 13): the overlap is what every driver refuses."""
    buf = torch.empty(16384, dtype=torch.uint8)
    at = -buf.data_ptr() % 4096  # a page's start
    first, second = buf[at : at + 384], buf[at + 128 : at + 256]  # the second inside the first
    assert host_pool._register(first) == "registered"
    try:
        assert host_pool._register(second) == "failed"
        x = torch.zeros(4, device="cuda")
        x.add_(1)  # a kernel launch and its check
        torch.cuda.synchronize()
        assert x.sum().item() == 4
    finally:
        host_pool._unregister(first.data_ptr())
