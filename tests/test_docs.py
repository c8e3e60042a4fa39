"""The documentation stays true: every flag a command line in README.md or docs/*.md uses is a flag of its command
(read off each parser), every path of this repository a page names exists, and
the README keeps its first screen, a table of contents and the three user paths as blocks of commands."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from oodforge.cli import COMMANDS, module_name

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPS = ("pipelines/", "gen/", "detectors/", "oodforge/", "benchmarks/", "scripts/", "configs/", "tests/", "docs/",
        ".ci/")
REFERENCE_PATHS = ("configs/postprocessors/", "configs/pipelines/", "configs/networks/", "configs/datasets/",
                   "scripts/locoop/", "scripts/ood/", "scripts/eval.sh", "scripts/eval_ood.py",
                   "scripts/eval_opengan.sh", "scripts/finetune.sh", "scripts/main.py",
                   "scripts/train_with_aux_data.sh", "docs/text/index.md",
                   "scripts/download/download.py", "scripts/eval_ood_imagenet.py", "configs/detector/",
                   "scripts/imagenet.sh", "scripts/uncertainty/", "configs/preprocessors/")
"""Files of the reference repositories (Open-Insect, OpenOOD, LoCoOp, OpenOOD-VLM, NegRefine, tdwg/dwc) the pages
cite by their own paths."""
WRITTEN_BY_RUNS = ("benchmarks/scale_21k.json",)
"""Files a documented command writes (not in the repository until it runs)."""
INVOCATION = re.compile(r"(?:python -m oodforge|oodforge|python scripts/(?P<script>\w+)\.py)\s+(?P<rest>[^`\n;&|]*)")


def _invocations(text: str) -> list[tuple[str, str]]:
    """(command, its arguments) of every `oodforge <command> ...` / `python scripts/<command>.py ...` line (a
    backslash continues it; it ends at a closing backtick, `&&`, `;`, `|` or a shell comment)."""
    text = re.sub(r"\\\n\s*", " ", text)
    found = []
    for match in INVOCATION.finditer(text):
        rest = match.group("rest")
        if match.group("script"):
            command, args = match.group("script").replace("_", "-"), rest
        else:
            command, _, args = rest.partition(" ")
        args = " ".join(re.split(r"\s#", args)[0].split())
        if command in COMMANDS:
            found.append((command, args))
    return found


@pytest.fixture(scope="module")
def flags() -> dict[str, set[str]]:
    """{command: every flag its parser takes}."""
    return {c: {o for a in importlib.import_module(module_name(c)).build_parser()._actions for o in a.option_strings}
            for c in COMMANDS}


def test_invocations_are_found_the_way_pages_write_them():
    text = ("```bash\noodforge import-folder new --ood --out x && oodforge report --results r\n"
            "python scripts/feature_map.py --id a \\\n  --n 3  # comment --ood\n```\n"
            "`oodforge pack-shards m --store s`")
    assert _invocations(text) == [("import-folder", "new --ood --out x"), ("report", "--results r"),
                                  ("feature-map", "--id a --n 3"), ("pack-shards", "m --store s")]


def test_every_flag_a_page_uses_is_its_commands(flags):
    assert "--images" in flags["feature-map"] and "--n" not in flags["feature-map"]  # the table this test reads
    found = []
    for page in PAGES:
        for command, args in _invocations(page.read_text(encoding="utf-8")):
            for token in args.split():
                flag = token.split("=")[0]
                if flag.startswith("--") and flag not in flags[command]:
                    found.append(f"{page.relative_to(ROOT)}: oodforge {command} {flag}: no such flag")
    assert not found, "\n".join(found)


def _named_paths(page: Path) -> set[str]:
    """The repository paths `page` names: in inline code (a `path:Symbol` or `path:line` suffix dropped) and as the
    targets of its relative links (resolved from its folder)."""
    text = page.read_text(encoding="utf-8")
    names = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        for token in code.split():
            token = token.strip(".,;()'\"").split(":")[0]
            if token.startswith(TOPS) and not re.search(r"[<>*{}\[\]$=|]|\.\.\.", token):
                names.add(token)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        target = target.split("#")[0]
        if target and not re.match(r"[a-z]+:", target):
            names.add(str((page.parent / target).resolve().relative_to(ROOT)))
    return names


def test_every_repository_path_a_page_names_exists():
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES for name in sorted(_named_paths(page))
               if not (ROOT / name).exists() and not name.startswith(REFERENCE_PATHS) and name not in WRITTEN_BY_RUNS]
    assert not missing, "\n".join(missing)


def test_the_readme_opens_with_the_quick_start_then_contents_and_the_three_paths():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:3] == ["Quick start (fresh machine, no downloads)", "Contents", "Three paths"]
    assert "make demo" in text.split("## Contents")[0] and "make test" in text.split("## Contents")[0]
    paths = text.split("## Three paths")[1].split("\n## ")[0]
    blocks = re.findall(r"```bash\n(.*?)```", paths, flags=re.S)
    assert len(blocks) == 3 and all("oodforge" in b for b in blocks)
    assert "import-folder" in blocks[0] and "import-open-insect" in blocks[1] and "generate" in blocks[2]
    assert "<!-- released-benchmark block -->" in paths
    for anchor in re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)", text.split("## Contents")[1].split("\n## ")[0], re.M):
        assert anchor in {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}, anchor


def test_the_layout_is_the_architecture_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Layout" not in text and "(docs/architecture.md)" in text


def test_the_own_data_path_is_the_commands_test_own_data_runs():
    """The first path's block holds the commands of "Your own data", which tests/pipelines/test_own_data.py runs
    verbatim on generated folders."""
    from tests.pipelines.test_own_data import readme_commands

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.findall(r"```bash\n(.*?)```", text.split("## Three paths")[1], flags=re.S)[0]
    path = [line.split("  #")[0].strip() for line in block.strip().splitlines()]
    ran = [part.strip() for line in readme_commands() for part in line.split("&&")]
    assert path == ran
