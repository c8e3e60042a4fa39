"""A library that logs: no library module prints, and a command's `-q` / `-v` set what its user sees."""
from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from pipelines.cli import PROJECT_LOGGERS, ConsoleHandler, configure_logging, parser, run_main
from pipelines.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("gen", "detectors", "pipelines")
"""The library packages: they log (`logging.getLogger(__name__)`); only commands (scripts/) print."""


def _print_calls(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line` of each call of the builtin `print` in the module at `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_no_library_module_calls_print():
    files = [p for package in LIBRARY for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100  # the scan sees the packages
    found = [call for p in files if "print" in p.read_text(encoding="utf-8") for call in _print_calls(p)]
    assert not found, f"library modules log (logging.getLogger(__name__)), never print: {found}"


def test_the_scan_finds_a_print_and_nothing_else(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(x, stream):\n    stream.write('print(x)')\n    if x:\n        print(x, flush=True)\n")
    assert _print_calls(path, tmp_path) == ["m.py:4"]


def _toy(argv: list[str] | None) -> int:
    """A command built like every script: `parser()`, then library modules logging at each level."""
    args = parser("toy", overrides=True).parse_args(argv)
    log = logging.getLogger("pipelines.toy")
    log.debug("toy: debug detail")
    log.info("toy: info line")
    log.warning("toy: warning line")
    return 0 if args.overrides == [] else 1


@pytest.mark.parametrize("flags, shown, hidden", [
    ([], ["toy: info line", "toy: warning line"], ["toy: debug detail"]),
    (["-q"], ["toy: warning line"], ["toy: info line", "toy: debug detail"]),
    (["--quiet"], ["toy: warning line"], ["toy: info line", "toy: debug detail"]),
    (["-v"], ["toy: debug detail", "toy: info line", "toy: warning line"], []),
    (["--verbose"], ["toy: debug detail", "toy: info line", "toy: warning line"], []),
])
def test_quiet_and_verbose_set_what_a_command_shows(capsys, flags, shown, hidden):
    assert run_main(_toy, flags) == 0
    printed = capsys.readouterr()
    for line in shown:
        assert line in printed.out + printed.err
    for line in hidden:
        assert line not in printed.out + printed.err
    assert "toy: warning line" not in printed.out  # warnings go to stderr, the rest to stdout
    assert "toy: info line" not in printed.err


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as stop:
        parser("toy").parse_args(["-q", "-v"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_errors_stay_one_line_under_quiet(capsys):
    def failing(argv):
        parser("toy").parse_args(argv)
        raise ConfigError("epochs: must be >= 1, got 0")

    assert run_main(failing, ["-q"]) == 2
    printed = capsys.readouterr()
    assert printed.err == "error: epochs: must be >= 1, got 0\n" and printed.out == ""


def test_messages_are_plain_and_follow_a_redirected_stream(capsys):
    configure_logging(logging.INFO)
    logging.getLogger("detectors.somewhere").info("plain %s", "message")
    assert capsys.readouterr().out == "plain message\n"
    for name in PROJECT_LOGGERS:  # one handler however often logging is configured
        configure_logging()
        assert sum(isinstance(h, ConsoleHandler) for h in logging.getLogger(name).handlers) == 1


def _configuring_calls(path: Path) -> list[str]:
    """`file:line` of each call that configures logging output: `basicConfig`, `addHandler`, `dictConfig`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("basicConfig", "addHandler", "dictConfig", "fileConfig")]


def test_only_the_command_layer_configures_logging():
    """A user of the Python API decides what is shown: no library module but pipelines/cli.py (`configure_logging`,
    called by the commands) adds a handler or configures logging."""
    files = [p for package in LIBRARY for p in sorted((ROOT / package).rglob("*.py"))
             if "Config(" in p.read_text(encoding="utf-8") or "addHandler(" in p.read_text(encoding="utf-8")]
    found = [call for p in files for call in _configuring_calls(p)]
    assert found and all(call.startswith("pipelines/cli.py:") for call in found), found
