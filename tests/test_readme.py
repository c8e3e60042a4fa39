"""README.md: its first screen shows the commands, a Python example that runs as written and the score sign; every
relative link in README.md and docs/ leads to a file (and a heading, for README.md's own anchors)."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIRST_SCREEN = 62
"""Lines a reader sees before scrolling (about a screen)."""


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def test_the_first_screen_holds_the_commands_the_api_and_the_sign():
    screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    bash = _blocks(screen, "bash")
    assert [line.split("#")[0].strip() for line in bash[0].splitlines()] == ["make demo", "make test"]
    cli = [line for line in bash[1].splitlines() if line.strip()]
    assert len(cli) == 5 and all(line.startswith("oodforge ") for line in cli), cli
    python = _blocks(screen, "python")
    assert len(python) == 1 and len(python[0].splitlines()) <= 25
    for call in ("detectors.build(", ".fit(", ".score(", "evaluate("):
        assert call in python[0], call
    assert "higher = more in-distribution" in screen and "pytorch-ood" in screen


def test_the_python_example_runs_as_written():
    code = _blocks(README.read_text(encoding="utf-8"), "python")[0]
    namespace: dict = {"__name__": "readme_example"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{README}:python block", "exec"), namespace)  # noqa: S102 - the README's own example
    metrics = eval(printed.getvalue().splitlines()[0])  # noqa: S307 - the example's printed dict of floats
    assert set(metrics) == {"auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out"}
    assert metrics["auroc"] > 0.9 and metrics["fpr95"] < 0.5  # the synthetic OOD rows are told apart
    id_scores, ood_scores = namespace["id_scores"], namespace["ood_scores"]
    assert id_scores.dtype.name == "float64" and id_scores.mean() > ood_scores.mean()  # higher = in-distribution
    assert "vim" in printed.getvalue().splitlines()[1]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_resolves():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", README.read_text(encoding="utf-8"), flags=re.M)}
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif not path and page == README and anchor not in anchors:
                broken.append(f"README.md: {target}")
    assert not broken, broken
