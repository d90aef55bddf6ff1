"""How long the API's calls take, as a histogram /metrics can show."""

from __future__ import annotations

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Latency:
    """A cumulative histogram of call durations (Prometheus' shape)."""

    def __init__(self) -> None:
        self.buckets = [0] * len(LATENCY_BUCKETS)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1

    def status(self) -> dict[str, object]:
        return {
            "buckets": dict(zip(LATENCY_BUCKETS, self.buckets, strict=True)),
            "count": self.count,
            "sum": self.sum,
        }
