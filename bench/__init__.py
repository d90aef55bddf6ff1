"""The benchmark suite: `python -m bench` (make bench) measures, on this machine and
a local broker, and writes docs/BENCHMARKS.md; `--smoke` is a seconds-long run of
the same code (make test runs it; no timing is asserted anywhere)."""
