"""The host expert pool on transparent huge pages: the advice, and that banks stay intact."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from freetoken.experts.base import ExpertBanks
from freetoken.hardware.huge_pages import HUGE_PAGE, advise_huge_pages

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


def _huge_bytes_under(t: torch.Tensor) -> int | None:
    """AnonHugePages of the mappings that hold ``t`` (/proc/self/smaps): this tensor's pages only, whatever the
    rest of the process allocates or frees meanwhile (a process-wide delta made the test flaky)."""
    lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    total, inside = 0, False
    for line in text.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start < hi and lo < end
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1]) * 1024
    return total


def _advised_share(nbytes: int) -> float:
    """The share of a fresh mapping of ``nbytes`` advised by hand that lands on huge pages here and now: a virtualised
    kernel, or one whose memory is too fragmented to compact, grants none or part whatever the advice (a CI machine
    in madvise mode gave 0; the dev box once a third of a 144 MiB pool)."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: shared is shmem
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
        t = torch.frombuffer(m, dtype=torch.uint8)
        t.fill_(1)
        got = _huge_bytes_under(t) or 0
        del t
        return got / nbytes
    finally:
        m.close()


@pytest.mark.skipif(_thp_mode() != "madvise", reason="needs THP in madvise mode (the advice decides)")
@pytest.mark.parametrize("advised", [True, False])
def test_banks_land_on_huge_pages(advised: bool) -> None:
    """``ExpertBanks.empty`` advises its banks: they land on huge pages about as much as a mapping advised by hand;
    the same bytes unadvised do not."""
    pool_bytes = 16 * 2048 * 1536 * 2 + 16 * 1536 * 1024 * 2
    # the contents first: a fresh 4 KiB-page allocation made between the probe and the banks' first write may take
    # the very 2 MiB blocks the probe just freed (CI's machine: probe 100%, banks 0%)
    src = torch.randn(16, 2048, 1536, dtype=torch.bfloat16)
    share = _advised_share(pool_bytes)
    if share < 0.25:
        pytest.skip(f"this machine grants huge pages to {share:.0%} of a mapping advised by hand, here and now")
    if advised:
        # gate_up 96 MiB, down 48 MiB: above glibc's largest mmap threshold (32 MiB), so fresh mappings, as the
        # engine's pool always is (smaller blocks may reuse heap pages an earlier test touched: 4 KiB pages)
        banks = ExpertBanks.empty(2, 8, 1536, 1024, torch.bfloat16)
    else:  # fresh anonymous mappings: malloc'd memory may reuse a range an earlier allocation advised
        maps = [mmap.mmap(-1, n * 2) for n in (16 * 2048 * 1536, 16 * 1536 * 1024)]
        gu, dn = (torch.frombuffer(m, dtype=torch.bfloat16) for m in maps)
        banks = ExpertBanks(gu.view(16, 2048, 1536), dn.view(16, 1536, 1024), 2, 8)
    assert banks.pool_bytes == pool_bytes
    banks.gate_up.copy_(src)
    banks.down.fill_(1.5)
    huge = [_huge_bytes_under(b) for b in (banks.gate_up, banks.down)]
    if None in huge:
        pytest.skip("no /proc/self/smaps")
    on_huge = sum(h or 0 for h in huge)
    if advised:  # as much as the hand-advised probe got, give or take what compaction leaves on 4 KiB pages
        if on_huge < share * pool_bytes / 2:  # what the machine grants now, beside the banks: it changes by the second
            share = min(share, _advised_share(pool_bytes))
        assert on_huge >= share * pool_bytes / 2, (on_huge, share)
    else:
        assert on_huge < pool_bytes // 4
    assert torch.equal(banks.gate_up, src)  # the contents are what was written, either way
    assert bool((banks.down == 1.5).all())
