"""The scripts owned by the CLI layer share pipelines.cli: `main(argv)` runs in-process, `--debug` exists everywhere,
input errors end as one line with exit status 2, and `--dry-run` lists a sweep without training anything."""
import importlib
import importlib.util
import json
from pathlib import Path

import pytest

from pipelines.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("demo", "convert_clipn", "train_prompts")  # oodforge.commands.<name>, wrapped by scripts/<name>.py
SCRIPTS = (*COMMANDS, "benchmarks.clip", "benchmarks.gram", "benchmarks.splits", "benchmarks.generate",
           "benchmarks.gpu", "scripts.check_layers")


def load(name):
    """A command module by name, or a benchmark / dev tool by its module path (imported, never loaded by path)."""
    return importlib.import_module(f"oodforge.commands.{name}" if name in COMMANDS else name)


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_has_a_testable_main_on_the_shared_parser(name, capsys):
    script = load(name)
    entry = ROOT / "scripts" / f"{name}.py" if name in COMMANDS else Path(script.__file__)  # what `python ...` runs
    assert "run_main(main" in entry.read_text()
    assert "argparse.ArgumentParser(" not in Path(script.__file__).read_text()
    with pytest.raises(SystemExit) as stop:
        script.main(["--help"])
    assert stop.value.code == 0 and "--debug" in capsys.readouterr().out


def test_train_prompts_dry_run_overrides_and_a_misspelt_key(tmp_path, capsys):
    script = load("train_prompts")
    config = tmp_path / "p.yaml"
    config.write_text("model: m\nmanifest: data\nmethods: {locoop: {epochs: 50}}\nshots: [1, 16]\nout_dir: runs/p\n")
    assert run_main(script.main, ["--config", str(config), "seeds=[1, 2]", "methods.locoop.epochs=3", "--out",
                                  str(tmp_path / "o"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"4 run(s) -> {tmp_path / 'o'}"
    assert out[1:] == [f"  locoop shots={s} seed={r} {{'epochs': 3}}" for s in (1, 16) for r in (1, 2)]
    config.write_text("model: m\nmanifest: data\nshot: [1]\n")
    assert run_main(script.main, ["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shot: unknown key (did you mean 'shots'?)" in err and "README.md, section" in err


def test_convert_clipn_missing_checkpoint_is_one_line(tmp_path, capsys):
    script = load("convert_clipn")
    assert run_main(script.main, [str(tmp_path / "none.pt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "none.pt: no such checkpoint file" in err and err.count("\n") == 1


def test_demo_rejects_an_unknown_stage(capsys):
    assert run_main(load("demo").main, ["--skip", "generation,clips"]) == 2
    err = capsys.readouterr().err
    assert "unknown stage(s) ['clips']" in err and err.count("\n") == 1


def test_bench_gram_main_argv_writes_its_json(tmp_path):
    out = tmp_path / "gram.json"
    load("benchmarks.gram").main(["--batch", "1", "--repeats", "1", "--rows", "40", "--classes", "3", "--out",
                                  str(out)])
    result = json.loads(out.read_text())
    assert result["features"]["max_rel_diff"] < 1e-9 and result["scoring"]["rows"] == 40
