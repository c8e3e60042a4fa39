"""One command-line style: every command's parser built, one name per thing (no synonym of a canonical flag, one flag
per config dest), one meaning per name (a flag has one kind, type and set of choices across commands), every flag
in docs/cli.md's table with the commands that take it, and `oodforge --help` listing every command of scripts/
but the benchmarks and the dev tools."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from oodforge.cli import COMMANDS, GROUPS, main, module_name
from pipelines.cli import comma_list

ROOT = Path(__file__).resolve().parents[2]
DEV_TOOLS = {"check_layers", "check_report_html"}
"""scripts/ that are not user commands (besides the benchmarks, bench_*.py)."""
SYNONYMS: dict[str, tuple[str, ...]] = {
    "--batch-size": ("--batch", "--bs", "--batchsize"),
    "--images": ("--n", "--n-images", "--num-images", "--items", "--count"),
    "--workers": ("--num-workers", "--jobs", "--processes", "--procs", "-j"),
    "--out": ("--output", "--out-dir", "--output-dir", "-o"),
    "--split-ratio": ("--ratio", "--splits-ratio"),
    "--seed": ("--random-seed", "--rng-seed"),
    "--config": ("--cfg", "-c"),
    "--dry-run": ("--dryrun", "--plan"),
    "--shard-dir": ("--shards-dir", "--store-dir"),
}
"""The one name of a thing -> spellings no command may use for it."""
TYPED = {"fetch-images", "make-splits", "pack-shards", "curate-containers", "import-open-insect"}
"""Commands whose untyped flags are read as YAML and checked by their typed config (type `config` in docs/cli.md)."""


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return {c: importlib.import_module(module_name(c)).build_parser() for c in COMMANDS}


def visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"]


def kind(action: argparse.Action, command: str) -> str:
    """The type column of docs/cli.md for one command's flag."""
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return "switch"
    if action.choices:
        return " | ".join(map(str, action.choices))
    if action.type is None:
        return "config" if command in TYPED else "text"
    return {int: "int", float: "float", Path: "path", comma_list: "list"}.get(action.type, "list")


def table() -> dict[str, tuple[str, set[str] | None, str]]:
    """docs/cli.md's flag table: {flag: (meaning, commands (None: every command), type)}."""
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("## Every flag", 1)[1]
    rows = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\| `(--[\w-]+)` \| (.+) \| ([\w, -]+) \| (.+) \| [^|]+ \|", line)
        if match:
            flag, meaning, commands, typ = match.groups()
            assert flag not in rows, f"docs/cli.md: {flag} has two rows"
            rows[flag] = (meaning, None if commands == "every command" else set(commands.split(", ")),
                          typ.replace("\\|", "|").split(",")[0].strip())
    return rows


def test_help_lists_every_command_of_scripts_but_benchmarks_and_dev_tools(capsys):
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py") if not p.stem.startswith("bench_")} - DEV_TOOLS
    assert {c.replace("-", "_") for c in COMMANDS} == scripts
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"^  ([a-z][a-z-]+)  ", out, re.M)
    assert listed == list(COMMANDS) and sorted(listed) == sorted({c for names in GROUPS.values() for c in names})
    assert [g for g in GROUPS][:5] == ["data", "train", "generate", "evaluate", "report"]
    for group in GROUPS:
        assert f"\n{group}:\n" in out
    for name in scripts:  # each wrapper runs the command module's main
        text = (ROOT / "scripts" / f"{name}.py").read_text()
        assert f"from oodforge.commands.{name} import DOC, main" in text and "run_main(main, doc=DOC)" in text


def test_unknown_command_is_one_line_with_the_closest(capsys):
    assert main(["fetch-image"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'fetch-image' (did you mean 'fetch-images'?)" in err
    assert main([]) == 2 and "usage: oodforge <command>" in capsys.readouterr().out


@pytest.mark.slow
def test_python_m_oodforge_and_the_installed_entry_point():
    done = subprocess.run([sys.executable, "-m", "oodforge", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0 and all(f"  {c} " in done.stdout for c in COMMANDS), done.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"oodforge": "oodforge.cli:main"}
    assert "oodforge*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    usage = subprocess.run([sys.executable, "-m", "oodforge", "report", "--help"], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: oodforge report ")


def test_the_api_is_lazy_and_is_the_packages_own():
    done = subprocess.run([sys.executable, "-c", "import sys, oodforge; print('detectors' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr
    import detectors
    import detectors.metrics
    import oodforge

    assert oodforge.build is detectors.build and oodforge.FeatureSet is detectors.FeatureSet
    assert oodforge.evaluate is detectors.metrics.evaluate and "LinearHead" in dir(oodforge)
    with pytest.raises(AttributeError, match="no attribute 'bulid'"):
        oodforge.bulid  # noqa: B018


def test_no_command_spells_a_thing_another_way(parsers):
    banned = {old: new for new, olds in SYNONYMS.items() for old in olds}
    for command, p in parsers.items():
        for action in visible(p):
            for flag in action.option_strings:
                assert flag not in banned, f"oodforge {command} {flag}: the name of this thing is {banned[flag]}"


def test_one_config_dest_has_one_flag_and_one_flag_one_meaning(parsers):
    flags: dict[str, set[str]] = {}
    kinds: dict[str, set[str]] = {}
    for command, p in parsers.items():
        for action in visible(p):
            flags.setdefault(action.dest, set()).add(action.option_strings[0])
            kinds.setdefault(action.option_strings[0], set()).add(kind(action, command))
    assert {dest: f for dest, f in flags.items() if len(f) > 1} == {}
    for flag, found in kinds.items():  # untyped (text / config) flags are typed by what reads them
        typed = found - {"text", "config"}
        assert len(typed) <= 1, f"{flag} means different things: {sorted(found)}"


def test_docs_cli_md_lists_every_flag_with_its_commands_and_type(parsers):
    rows = table()
    taken: dict[str, set[str]] = {}
    for command, p in parsers.items():
        for action in visible(p):
            flag = action.option_strings[0]
            taken.setdefault(flag, set()).add(command)
            assert flag in rows, f"docs/cli.md has no row for {flag} (oodforge {command})"
            meaning, commands, typ = rows[flag]
            mine = kind(action, command)
            assert mine == typ or (mine in ("text", "config") and typ not in ("switch",) and "|" not in typ), \
                f"docs/cli.md: {flag} is {typ}, oodforge {command} takes {mine}"
    assert sorted(set(rows) - set(taken)) == []  # no row for a flag no command has
    for flag, (_, commands, _) in rows.items():
        assert (commands or set(COMMANDS)) == taken[flag], \
            f"docs/cli.md: {flag} lists {commands}, taken by {taken[flag]}"
