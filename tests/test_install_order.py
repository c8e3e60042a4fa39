"""`make install` is quiet (no pip dependency-resolver ERROR, e.g. for guided-diffusion-sdk): a resolving
`pip install` checks the requirements of every installed package it touches, so one that runs after a package went in
with `--no-deps` reports the requirements that package skipped. Every `--no-deps` install must come last, in the
Makefile's install recipe and the `.ci/parity_deps` script it runs, in the order they run."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install_steps() -> list[str]:
    """The pip installs of `make install`, in order (`bash .ci/parity_deps` expanded)."""
    makefile = ROOT.joinpath("Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", makefile, re.M)[1].splitlines()
    steps = []
    for line in recipe:
        if "parity_deps" in line:
            steps += [s for s in ROOT.joinpath(".ci", "parity_deps").read_text(encoding="utf-8").splitlines()
                      if re.search(r"\binstall\b", s) and not s.lstrip().startswith("#")]
        elif re.search(r"\binstall\b", line):
            steps.append(line)
    return steps


def test_every_no_deps_install_comes_after_every_resolving_install():
    steps = install_steps()
    no_deps = [("--no-deps" in step) for step in steps]
    assert len(steps) >= 5 and any(no_deps) and not all(no_deps), steps
    first = no_deps.index(True)
    assert all(no_deps[first:]), f"a resolving install after a --no-deps one: {steps[first:]}"
    assert sum("guided-diffusion-sdk" in step for step in steps) == 1  # installed once, with the other references
