"""Benchmarks: one module per measurement, each writing its JSON result beside itself (`benchmarks/<name>.json`).

Run from the repository root as a module, e.g. `python -m benchmarks.detectors` (`make bench`) or
`python -m benchmarks.gpu --dry-run`; `--out` writes elsewhere. `benchmarks.cases` holds measurements several
benchmarks share. Not installed with the package: benchmarks may import every package, and only tests import them.
"""
