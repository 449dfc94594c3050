"""Prometheus text exposition: the server's own counters plus every number in ``engine.stats()``."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

# TTFT histogram buckets in seconds (upper bounds; +Inf is implicit).
_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Counters updated from the event loop (and read from any thread, hence the lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.requests_total = 0
        self.requests_running = 0
        self.errors_total: dict[str, int] = {}
        self.generated_tokens_total = 0
        self.generation_seconds_total = 0.0
        self.ttft_counts = [0] * (len(_TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self._recent: list[tuple[float, int]] = []  # (finish time, tokens) for the tokens/s gauge

    def request_started(self) -> None:
        with self._lock:
            self.requests_total += 1
            self.requests_running += 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            i = next((k for k, b in enumerate(_TTFT_BUCKETS) if seconds <= b), len(_TTFT_BUCKETS))
            self.ttft_counts[i] += 1

    def request_finished(self, tokens: int, seconds: float) -> None:
        with self._lock:
            self.requests_running -= 1
            self.generated_tokens_total += tokens
            self.generation_seconds_total += seconds
            now = time.time()
            self._recent.append((now, tokens))
            self._recent = [r for r in self._recent if now - r[0] <= 60.0]

    def error(self, kind: str) -> None:
        with self._lock:
            self.errors_total[kind] = self.errors_total.get(kind, 0) + 1

    def tokens_per_second(self) -> float:
        """Generated tokens per second over the last minute (or since start, if younger)."""
        with self._lock:
            window = min(60.0, max(1e-3, time.time() - self.started_at))
            return sum(t for _, t in self._recent) / window

    def render(self, engine_stats: dict[str, Any], engine_state: str) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, value: float, labels: str = "") -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{labels} {_fmt(value)}")

        tps = self.tokens_per_second()
        with self._lock:
            metric("freetoken_up", "gauge", "1 when the engine is ready", float(engine_state == "ready"))
            metric("freetoken_requests_total", "counter", "Generation requests started", self.requests_total)
            metric("freetoken_requests_running", "gauge", "Requests being served now", self.requests_running)
            metric("freetoken_generated_tokens_total", "counter", "Tokens generated", self.generated_tokens_total)
            metric("freetoken_generation_tokens_per_second", "gauge", "Generated tokens/s, last minute", tps)
            lines.append("# HELP freetoken_errors_total Requests answered with an error, by kind")
            lines.append("# TYPE freetoken_errors_total counter")
            for kind, n in sorted(self.errors_total.items()):
                lines.append(f'freetoken_errors_total{{kind="{kind}"}} {n}')
            lines.append("# HELP freetoken_time_to_first_token_seconds Time to first token")
            lines.append("# TYPE freetoken_time_to_first_token_seconds histogram")
            cum = 0
            for b, n in zip(_TTFT_BUCKETS, self.ttft_counts):
                cum += n
                lines.append(f'freetoken_time_to_first_token_seconds_bucket{{le="{b}"}} {cum}')
            lines.append(f'freetoken_time_to_first_token_seconds_bucket{{le="+Inf"}} {self.ttft_count}')
            lines.append(f"freetoken_time_to_first_token_seconds_sum {_fmt(self.ttft_sum)}")
            lines.append(f"freetoken_time_to_first_token_seconds_count {self.ttft_count}")
        # Engine counters: every numeric entry of stats() (queue, KV/cache occupancy, expert hits, …).
        for key, value in sorted(_flatten(engine_stats).items()):
            name = "freetoken_engine_" + _sanitize(key)
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_fmt(value)}")
        # Occupancy of every pool the engine reports as <name>_used / <name>_total (KV pages, slots, …).
        flat = _flatten(engine_stats)
        for key in sorted(k for k in flat if k.endswith("_used")):
            total = flat.get(key[: -len("_used")] + "_total")
            if total:
                name = "freetoken_" + _sanitize(key[: -len("_used")]) + "_occupancy"
                metric(name, "gauge", "Fraction in use", flat[key] / total)
        _labelled(lines, "freetoken_step_graph_eager_fallbacks_total", "reason",
                  "Decode steps run eagerly although step graphs are on, by reason",
                  engine_stats.get("step_graph_eager_fallback_reasons") or {})  # fmt: skip
        hits = engine_stats.get("expert_hits")
        misses = (engine_stats.get("expert_fills") or 0) + (engine_stats.get("expert_cpu_runs") or 0)
        if isinstance(hits, (int, float)):
            total = hits + misses
            metric(
                "freetoken_expert_hit_rate",
                "gauge",
                "Expert-cache hit rate since start",
                hits / total if total else 0.0,
            )
        return "\n".join(lines) + "\n"


def _labelled(lines: list[str], name: str, label: str, help_: str, counts: dict[str, int]) -> None:
    """A counter with one sample per label value (none yet: its HELP and TYPE only)."""
    lines.append(f"# HELP {name} {help_}")
    lines.append(f"# TYPE {name} counter")
    lines += [f'{name}{{{label}="{_sanitize(k)}"}} {n}' for k, n in sorted(counts.items())]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            out[key] = float(v)
        elif isinstance(v, dict):
            out.update(_flatten(v, key + "_"))
    return out


def _sanitize(key: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def _fmt(v: float) -> str:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    return repr(float(v)) if isinstance(v, float) else str(v)
