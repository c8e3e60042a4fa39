"""The one command-line layer of the scripts: the shared flags, list and pair parsing, typed options (`cli_value`,
`flag_error`: a config key named as the flag the user typed), `--debug`, and `run_main`, which turns the user's own
mistakes into one line and exit status 2. Config files and `key=value` overrides are read by `pipelines.configfile`,
through `pipelines.params.Config.from_yaml`.

A command (`oodforge.commands.<name>`, run by `oodforge <name>` and wrapped by scripts/<name>.py) is
`def main(argv=None) -> int | None` built on `parser()` and run as `run_main(main, doc=DOC)`, so every entry point is
testable in-process (`main([...])`), hides the same library chatter (`quiet_warnings`), shows the library's log
records alike (`configure_logging`: `-q` / `-v`) and reports bad input alike: one line naming the key or file and where
that input is documented (README sections and docs/ files only), exit status 2.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipelines.configfile import display_path, pair, parse_yaml, yaml_problem
from pipelines.errors import ConfigError, UserInputError
from pipelines.progress import progress_style

log = logging.getLogger(__name__)

README_SECTIONS: dict[str, str] = {
    "config": "README.md, section 'Evaluation'",
    "manifest": "README.md, section 'Data formats'",
    "generation": "docs/generation.md",
    "prompts": "README.md, section 'CLIP-prompt detectors and prompt training'",
    "scripts": "README.md, section 'Commands'",
}
"""Where each kind of input is documented, named in one-line errors (paths inside the repository only)."""

# Library chatter an entry point hides: (category, message regex, module regex) for `warnings.filterwarnings`.
QUIET_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (FutureWarning, "", r"(transformers|diffusers|huggingface_hub|accelerate)(\.|$)"),
    (DeprecationWarning, "", r"(transformers|diffusers|huggingface_hub|accelerate|torch)(\.|$)"),
    (UserWarning, r".*(deprecated|will be removed)", r"(transformers|diffusers|huggingface_hub|torch)(\.|$)"),
)
QUIET_LOG_MESSAGES: dict[str, tuple[str, ...]] = {
    # transformers 5 without torchvision: every `<X>ImageProcessor` silently uses its PIL twin, which is what we want
    "transformers.utils.import_utils": (r"`\w+` requires torchvision \(not installed\); falling back",),
    # diffusers warns on every `.to(dtype)` of a model, also when no module is to be kept in fp32 (the empty list);
    # ZeST's pipeline moves its VAE so on every call (SDXL's fp32 upcast): one line per image
    "diffusers.models.modeling_utils": (r"There are modules in \w+ that should be kept in float32: \[\]\.",),
}
"""Library log records an entry point drops: {logger name: message regexes}."""


class _DropMessages(logging.Filter):
    """A logger filter dropping the records whose message matches one of `patterns`."""

    def __init__(self, patterns: Sequence[str]):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


PROJECT_LOGGERS = ("pipelines", "gen", "detectors", "oodforge")
"""The loggers a command shows its user (every library module logs under one of them, `logging.getLogger(__name__)`)."""


class ConsoleHandler(logging.Handler):
    """Plain log messages, as the commands printed them: INFO and below to stdout, WARNING and above to stderr. The
    streams are looked up at each record, so a redirected `sys.stdout` / `sys.stderr` is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: a failing handler reports, never raises
            self.handleError(record)


def configure_logging(level: int = logging.INFO) -> None:
    """Show the project's log records at `level` and above on the console (`ConsoleHandler`, one per logger however
    often it is called). Called by `run_main`; a user of the Python API configures logging as they like instead."""
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
            logger.addHandler(ConsoleHandler())


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser that applies the parsed `-q/--quiet` (WARNING) or `-v/--verbose` (DEBUG) to the console
    logging (`configure_logging`); INFO without either, what a command's user always saw."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if hasattr(parsed, "quiet"):
            configure_logging(logging.WARNING if parsed.quiet else logging.DEBUG if parsed.verbose else logging.INFO)
        return parsed, rest


def parser(description: str | None, *, config: bool = False, overrides: bool = False, out: bool = False,
           dry_run: bool = False) -> argparse.ArgumentParser:
    """An ArgumentParser with the shared flags: `--debug`, `-q/--quiet` and `-v/--verbose` always; `--config`,
    `key=value` overrides, `--out` and `--dry-run` when asked for."""
    p = CommandParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if config:
        p.add_argument("--config", required=True, type=Path, help="YAML config")
    if overrides:
        p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, values parsed as YAML "
                                                                         "(dotted keys reach nested mappings)")
    if out:
        p.add_argument("--out", type=Path, help="output folder (overrides the config's)")
    if dry_run:
        p.add_argument("--dry-run", action="store_true", help="print the plan and exit without loading any model")
    p.add_argument("--debug", action="store_true", help="show the full traceback of input errors")
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("--quiet", "-q", action="store_true", help="show warnings and errors only (no progress notes)")
    talk.add_argument("--verbose", "-v", action="store_true", help="also show debugging messages")
    return p


def quiet_warnings() -> None:
    """Hide the libraries' deprecation chatter (`QUIET_WARNINGS`, `QUIET_LOG_MESSAGES`, transformers' advisory notes)
    and, off a terminal, turn off the libraries' own progress bars; the project's own warnings stay. Called by
    `run_main` before the script runs."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    for category, message, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, patterns in QUIET_LOG_MESSAGES.items():
        logger = logging.getLogger(name)  # the same object the library logs through, created now if not yet
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(patterns))
    if progress_style() != "bar":
        quiet_library_bars()


def quiet_library_bars() -> None:
    """Turn off the hub libraries' own tqdm bars (weight loading, downloads, diffusion steps): off a terminal they
    write carriage-return updates into logs. Already imported libraries are told directly, later ones by environment."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    for library in ("transformers", "diffusers"):
        if library in sys.modules:
            __import__(f"{library}.utils.logging", fromlist=["disable_progress_bar"]).disable_progress_bar()


def comma_list(value: str | Sequence[str] | None) -> list[str] | None:
    """'a, b,c' -> ['a', 'b', 'c'] (a list passes through; None and '' give None)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(v).strip() for v in items if str(v).strip()]
    return items or None


def int_list(value: str | Sequence[Any] | None) -> list[int] | None:
    """'1, 2,4' -> [1, 2, 4] (`comma_list` of integers); a non-integer item raises ConfigError naming it."""
    items = comma_list(value if value is None or isinstance(value, str) else [str(v) for v in value])
    if items is None:
        return None
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {value!r}") from None


def pairs(values: Sequence[str] | None, flag: str = "argument") -> dict[str, str]:
    """Repeated NAME=VALUE arguments as a dict; a name given twice is an error."""
    out: dict[str, str] = {}
    for value in values or []:
        name, rest = pair(value, flag)
        if name in out:
            raise ConfigError(f"{flag}: {name!r} is given twice")
        out[name] = rest
    return out


def cli_value(text: Any) -> Any:
    """A command-line value as YAML 1.2 reads it (numbers become numbers; the config then checks the type)."""
    if isinstance(text, list):
        return [cli_value(t) for t in text]
    return parse_yaml(text) if isinstance(text, str) and text.strip() else text


def flag_error(err: ConfigError, flags: dict[str, str]) -> ConfigError:
    """`err` naming the flag: `flags` maps a dotted key (or its prefix) to a flag, any other key `K` (or `section.K`)
    is `--K` with dashes; the rest of a longer key follows the flag (`split.regions.mars` -> `--box mars`)."""
    key, found, rest = str(err).partition(": ")
    if not found or " " in key:
        return err
    if not key:  # a check across options
        return ConfigError(rest, doc=err.doc)
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in flags:
            return ConfigError(" ".join([flags[prefix], *parts[n:]]) + f": {rest}", doc=err.doc)
    return ConfigError(f"--{parts[min(1, len(parts) - 1)].replace('_', '-')}: {rest}", doc=err.doc)


def one_line(err: BaseException, doc: str | None = None) -> str:
    """`error: <message> (see <doc>)` on one line: the error's own `doc`, else `doc`, names where the input is
    documented; a YAML error names its file, line and column."""
    if isinstance(err, yaml.YAMLError):
        mark = getattr(err, "problem_mark", None)
        where = f"{getattr(mark, 'name', None) or 'YAML'}" if mark is not None else "YAML"
        text = f"{display_path(where) if where != 'YAML' else where}: not valid YAML ({yaml_problem(err)})"
    else:
        text = str(err) or type(err).__name__
    text = " ".join(text.split())
    doc = getattr(err, "doc", None) or doc
    return f"error: {text}" + (f" (see {doc})" if doc and doc not in text else "")


def run_main(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None,
             doc: str | None = None) -> int:
    """Run `main(argv)` after `quiet_warnings()` and `configure_logging()` (its parser applies `-q` / `-v`): user-input
    errors (and YAML errors) are one logged line, `one_line`, and give 2 (`--debug` prints the traceback instead); other
    exceptions keep their traceback. `doc` names where the script's inputs are documented (README section or docs/
    file). Returns the exit status for `sys.exit`."""
    args = sys.argv[1:] if argv is None else argv
    quiet_warnings()
    configure_logging()
    try:
        return int(main(args) or 0)
    except (UserInputError, FileNotFoundError, NotADirectoryError, yaml.YAMLError) as err:
        if "--debug" in args:
            traceback.print_exc()
        else:
            log.error(one_line(blame_override(err, args), doc))
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: rerun the same command to resume")
        return 130
    except OSError as err:
        if err.errno not in DISK_ERRORS:
            raise
        if "--debug" in args:
            traceback.print_exc()
        else:
            log.error(disk_error_line(err))
        return 2


_OVERRIDE = re.compile(r"^(?P<key>[A-Za-z_][\w-]*(?:\.[\w-]+)*)=")


def blame_override(err: BaseException, argv: Sequence[str]) -> BaseException:
    """`err` naming the `key=value` override it is about: a config error names the key as found in the merged config,
    after the config file's name (`own.yaml: batchsize: unknown key`), though the user typed the key as an override
    (`batchsize=32`); the file is then replaced by the override. Other errors are returned unchanged."""
    if not isinstance(err, UserInputError):
        return err
    args = list(argv)
    config = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None) or next(
        (a.partition("=")[2] for a in args if a.startswith("--config=")), None)
    text = str(err)
    if config is None:
        return err
    for name in dict.fromkeys((config, display_path(config), str(Path(config)))):
        if text.startswith(name) and text[len(name):len(name) + 1] in (":", "."):
            rest = text[len(name) + 1:].lstrip()
            break
    else:
        return err
    keys = re.sub(r"\[(\d+)\]", r".\1", rest.partition(": ")[0]).split(".")  # detectors[0].k -> detectors.0.k
    for item in args:
        found = _OVERRIDE.match(item)
        parts = found["key"].split(".") if found else []
        # a list item named in the override (detectors.knn.params.k) is its index in the message (detectors[1])
        if found and len(keys) >= len(parts) and all(k == p or k.isdigit() for k, p in zip(keys, parts)):
            blamed = type(err)(f"override {item}: {rest}")
            blamed.doc = getattr(err, "doc", None)
            return blamed
    return err


DISK_ERRORS = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some of your disk quota",
               errno.EACCES: "fix its permissions or choose another folder",
               errno.EPERM: "fix its permissions or choose another folder", errno.EROFS: "choose a writable folder"}


def disk_error_line(err: OSError) -> str:
    """One line for a full disk or a refused file operation: the path, the system's reason and what to do."""
    path = err.filename2 if err.filename2 is not None else err.filename
    where = f"{display_path(os.fsdecode(path))}: " if path is not None else ""
    reason = err.strerror or errno.errorcode.get(err.errno, str(err.errno))
    return f"error: {where}{reason}; {DISK_ERRORS[err.errno]}, then rerun the same command (finished work is kept)"
