"""Benchmark and demo helpers of the detector families (used by scripts/bench_*.py and scripts/demo.py), kept out of
the family packages so that the registry's walk over them imports only detectors."""
