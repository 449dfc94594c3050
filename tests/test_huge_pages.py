"""The host expert pool on transparent huge pages: the advice, and that banks stay intact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freetoken.experts.base import ExpertBanks
from freetoken.hardware.huge_pages import HUGE_PAGE, advise_huge_pages, huge_page_bytes

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    try:
        text = _THP.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else None


def test_advice_covers_the_aligned_interior() -> None:
    t = torch.empty(9 * HUGE_PAGE, dtype=torch.uint8)
    n = advise_huge_pages(t)
    if _thp_mode() is None:
        pytest.skip("no transparent huge pages on this machine")
    assert n % HUGE_PAGE == 0
    assert 7 * HUGE_PAGE <= n <= 9 * HUGE_PAGE  # all of it but the unaligned ends


def test_too_small_or_not_on_the_cpu_gets_no_advice() -> None:
    assert advise_huge_pages(torch.empty(HUGE_PAGE // 2, dtype=torch.uint8)) == 0
    assert advise_huge_pages(torch.empty(0)) == 0
    if torch.cuda.is_available():
        assert advise_huge_pages(torch.empty(4 * HUGE_PAGE, dtype=torch.uint8, device="cuda")) == 0


@pytest.mark.skipif(_thp_mode() != "madvise", reason="needs THP in madvise mode (the advice decides)")
@pytest.mark.parametrize("advised", [True, False])
def test_banks_land_on_huge_pages(advised: bool) -> None:
    """``ExpertBanks.empty`` advises its banks: they land on huge pages; the same bytes unadvised do not."""
    before = huge_page_bytes()
    if before is None:
        pytest.skip("no /proc/self/smaps_rollup")
    if advised:
        banks = ExpertBanks.empty(2, 8, 1024, 512, torch.bfloat16)  # gate_up 32 MiB, down 16 MiB
    else:
        banks = ExpertBanks(torch.empty(16, 1024, 1024, dtype=torch.bfloat16),
                            torch.empty(16, 1024, 512, dtype=torch.bfloat16), 2, 8)  # fmt: skip
    src = torch.randn(banks.gate_up.shape).bfloat16()
    banks.gate_up.copy_(src)
    banks.down.fill_(1.5)
    gained = (huge_page_bytes() or 0) - before
    if advised:
        assert gained >= banks.pool_bytes // 2  # most of the pool (compaction may leave some on 4 KiB)
    else:
        assert gained < banks.pool_bytes // 4
    assert torch.equal(banks.gate_up, src)  # the contents are what was written, either way
    assert bool((banks.down == 1.5).all())
