"""One config path: every command of the CLI's command table loads its typed config through `Config.from_yaml` (the
file, the `key=value` overrides, then its flags as shorthands of keys, each command's `FLAGS` table), no command reads
a config another way, every shorthand names a flag of the command and a key of its config, and docs/cli.md's key
column is those tables."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from oodforge.cli import COMMANDS, module_name
from pipelines.errors import ConfigError
from pipelines.params import Config

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {  # the arguments each command's parser needs before the config is loaded
    "evaluate": ["--config", "c.yaml"], "generate": ["--config", "c.yaml"], "train-classifier": ["--config", "c.yaml"],
    "train-prompts": ["--config", "c.yaml"],
    "aux-study": ["--config", "c.yaml", "--method", "msp", "--species", "1", "--budget", "1", "--out", "o"],
    "pack-shards": ["src", "--out", "o"], "curate-containers": ["--out", "o"],
}
OTHER_LOADERS = {"load_yaml", "apply_overrides", "deep_merge", "parse_yaml", "config_raw", "check_keys", "set_key"}
"""Names a command never imports: reading a config is `Config.from_yaml`'s job."""


class Loaded(Exception):
    """Raised by the stand-in loader: the command got as far as loading its config, through the one function."""


@pytest.fixture(scope="module")
def loaded() -> dict[str, type[Config]]:
    """{command: the config class it loads through Config.from_yaml}, each command run with its minimal arguments."""
    found: dict[str, type[Config]] = {}
    original = Config.__dict__["from_yaml"]

    def stand_in(cls, path, overrides=None, flags=None):
        found[current] = cls
        raise Loaded

    Config.from_yaml = classmethod(stand_in)
    try:
        for current in COMMANDS:
            with pytest.raises(Loaded):
                importlib.import_module(module_name(current)).main(MINIMAL.get(current, []))
    finally:
        Config.from_yaml = original
    return found


def test_every_command_loads_its_config_through_the_one_function(loaded):
    assert sorted(loaded) == sorted(COMMANDS)
    assert all(issubclass(cls, Config) for cls in loaded.values())


def test_no_command_reads_a_config_another_way():
    for command in COMMANDS:
        path = ROOT / "oodforge" / "commands" / f"{command.replace('-', '_')}.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names} & OTHER_LOADERS
                assert not names, f"oodforge {command} imports {sorted(names)}: load with Config.from_yaml"


def _key_field(cls: type[Config], key: str) -> bool:
    """True when the dotted `key` starts with fields of `cls` (a nested config's, for `split.seed`)."""
    for part in key.split("."):
        fields = cls.fields() if isinstance(cls, type) and issubclass(cls, Config) else None
        if fields is None:
            return True  # a mapping's own keys (`split.regions`)
        if part not in fields:
            return False
        hint = cls.hints()[part]
        cls = next((a for a in (hint, *getattr(hint, "__args__", ())) if isinstance(a, type) and issubclass(a, Config)),
                   dict)
    return True


def test_every_shorthand_is_a_flag_of_the_command_and_a_key_of_its_config(loaded):
    for command in COMMANDS:
        module = importlib.import_module(module_name(command))
        parser = module.build_parser()
        flags = {o for a in parser._actions for o in a.option_strings}
        arguments = {a.dest.upper() for a in parser._actions if not a.option_strings and a.dest != "overrides"}
        for flag, keys in module.FLAGS.items():
            assert flag in flags | arguments, f"oodforge {command}: FLAGS names {flag}, which it does not take"
            for key in keys if isinstance(keys, tuple) else (keys,):
                assert _key_field(loaded[command], key), f"oodforge {command} {flag}: {key} is no key of its config"


def key_cells() -> dict[str, str]:
    """docs/cli.md's key column as the commands' FLAGS tables give it: {flag: cell}."""
    keys: dict[str, dict[str, list[str]]] = {}
    for command in COMMANDS:
        module = importlib.import_module(module_name(command))
        for action in module.build_parser()._actions:
            for flag in action.option_strings[:1]:
                key = module.FLAGS.get(flag)
                shown = "—" if key is None else ", ".join(f"`{k}`" for k in (key if isinstance(key, tuple) else (key,)))
                keys.setdefault(flag, {}).setdefault(shown, []).append(command)
    cells = {}
    for flag, by_key in keys.items():
        if len(by_key) == 1:
            cells[flag] = next(iter(by_key))
        else:
            cells[flag] = "; ".join(f"{key} ({', '.join(sorted(commands))})"
                                    for key, commands in sorted(by_key.items()))
    return cells


def test_docs_cli_md_names_the_key_of_every_flag():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("## Every flag", 1)[1]
    rows = dict(re.findall(r"^\| `(--[\w-]+)` \|.*\| ([^|]+) \|$", text, re.M))
    cells = key_cells()
    for flag in ("--help", "-h"):
        cells.pop(flag, None)
    wrong = {flag: (rows.get(flag, "").strip(), cell) for flag, cell in cells.items() if rows.get(flag, "").strip()
             != cell}
    assert not wrong, f"docs/cli.md key column (found, wanted): {wrong}"


def test_a_flag_wins_over_the_overrides_and_the_file_and_a_fault_names_its_source(tmp_path, monkeypatch):
    from oodforge.args import load_config, parse
    from oodforge.commands import fetch_images, make_splits, pack_shards, report
    from pipelines.cli import run_main

    monkeypatch.chdir(tmp_path)
    Path("splits.yaml").write_text("out: runs/splits\nsynthetic: 50\nsplit: {aux_species: 10, seed: 4}\n"
                                   "taxa: {preset: moths}\n")
    p = make_splits.build_parser()
    opts = make_splits.options(p.parse_args(["--config", "splits.yaml", "split.aux_species_by_region.c-america=7"]))
    assert (opts.out, opts.synthetic, opts.split.aux_species, opts.split.seed) == ("runs/splits", 50, 10, 4)
    assert opts.split.aux_species_by_region == {"c-america": 7} and opts.taxa.preset == "moths"
    flagged = make_splits.options(p.parse_args(["--config", "splits.yaml", "--aux-species", "20", "split.seed=5",
                                                "--seed", "6"]))
    assert (flagged.split.aux_species, flagged.split.seed) == (20, 6)
    Path("fetch.yaml").write_text("occurrences: occ.csv\nworkers: 3\nper_species: 9\n")
    cfg = fetch_images.config_of(fetch_images.build_parser().parse_args(["--config", "fetch.yaml", "--out", "o",
                                                                         "timeout=5", "--workers", "4"]))
    assert (cfg.occurrences, cfg.out, cfg.workers, cfg.per_species, cfg.timeout) == ("occ.csv", "o", 4, 9, 5)
    Path("pack.yaml").write_text("quality: 80\nshort_side: 256\nresize: keep_ratio\n")
    packed = pack_shards.config_of(parse(pack_shards.build_parser(), ["src", "--config", "pack.yaml", "--short-side",
                                                                      "128"], intermixed=True))
    assert (packed.quality, packed.short_side, packed.resize) == (80, 128, "keep_ratio")
    Path("report.yaml").write_text("results: [runs/x/results.csv]\nout: runs/x/report\ntop_k: 3\ndiagnostics: true\n")
    args = report.build_parser().parse_args(["--config", "report.yaml", "bootstrap=10", "--top-k", "5"])
    got = load_config(report.ReportConfig, args, report.FLAGS)
    assert (got.results, got.out, got.top_k, got.bootstrap, got.diagnostics) == (["runs/x/results.csv"],
                                                                                 "runs/x/report", 5, 10, True)
    with pytest.raises(ConfigError, match=r"^--top-k: must be an integer"):
        load_config(report.ReportConfig, report.build_parser().parse_args(["--config", "report.yaml", "--top-k",
                                                                            "5"]), {"--top-k": "top_k"},
                    {"--top-k": str})
    with pytest.raises(ConfigError, match=r"^report.yaml: topk: unknown key \(did you mean 'top_k'\?\)"):
        load_config(report.ReportConfig, report.build_parser().parse_args(["--config", "report.yaml", "topk=1"]),
                    report.FLAGS)
    with pytest.raises(ConfigError, match=r"^--results: required"):
        load_config(report.ReportConfig, report.build_parser().parse_args(["--out", "o"]), report.FLAGS)
    assert run_main(report.main, ["--config", "report.yaml", "top_k=many"]) == 2  # an override: one line, exit 2
