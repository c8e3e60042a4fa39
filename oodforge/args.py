"""The one command-line style of `oodforge <command>`: the shared flags, and every command's typed config loaded by
`load_config` through the one loader, `pipelines.params.Config.from_yaml`: the `--config` file, the `key=value`
overrides, then the command's flags as shorthands of its keys (each command's `FLAGS` table; docs/cli.md lists every
flag and the key it stands for).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.cli import parser as base_parser
from pipelines.errors import ConfigError
from pipelines.params import C


def command_parser(module: str, doc: str | None, *, config: str | None = "optional", out: bool = False,
                   dry_run: bool = False) -> argparse.ArgumentParser:
    """The parser of the command module `module` (its `__name__`): usage `oodforge <command>`, `--debug`, `--config`
    (`config`: "optional", "required" or None) with `key=value` overrides, and `--out` / `--dry-run` when asked."""
    p = base_parser(doc, config=config == "required", overrides=config is not None, out=out, dry_run=dry_run)
    p.prog = "oodforge " + module.rsplit(".", 1)[-1].replace("_", "-")
    if config == "optional":
        p.add_argument("--config", type=Path, default=None, help="YAML config (keys: docs/cli.md); flags override it")
    p.error = _one_line  # type: ignore[method-assign]
    return p


def _one_line(message: str) -> None:
    """argparse's own errors (a missing flag, a bad number) as every other input error: one line, exit status 2."""
    raise ConfigError(message)


def load_config(cls: type[C], args: argparse.Namespace, flags: Mapping[str, str | tuple[str, ...]],
                convert: Mapping[str, Callable[[Any], Any]] | None = None) -> C:
    """The command's typed config through the one loader, `Config.from_yaml`: the `--config` file, the `key=value`
    overrides, then the flags given (not None) as shorthands of keys. `flags` is the command's table {flag: dotted
    key} (docs/cli.md lists it; a positional argument is named in capitals, SOURCE); `convert` turns a flag's value
    into its key's (paths become strings on their own)."""
    given: dict[str, tuple[str | tuple[str, ...], Any]] = {}
    for flag, key in flags.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_").lower(), None)
        if value is None or value == []:
            continue
        value = (convert or {}).get(flag, _plain)(value)
        given[flag] = (key, value)
    try:
        return cls.from_yaml(getattr(args, "config", None), getattr(args, "overrides", None), given)
    except ConfigError as err:  # a required key neither the file nor a flag gave: named as the flag that gives it
        for flag, key in flags.items():
            if str(err).startswith(f"{key}: required"):
                raise ConfigError(f"{flag}{str(err)[len(str(key)):]}", doc=err.doc) from None
        raise


def _plain(value: Any) -> Any:
    """A parsed flag value as config data: paths as strings (in lists too)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None, intermixed: bool = False) -> argparse.Namespace:
    """Parse `argv` (`intermixed`: positionals and flags in any order), the `key=value` overrides after the
    command's own positionals (`make-tiny clip --out DIR seed=1`)."""
    for actions in (p._actions, *(g._group_actions for g in p._action_groups)):
        found = [a for a in actions if a.dest == "overrides"]
        for action in found:
            actions.remove(action)
            actions.append(action)
    return (p.parse_intermixed_args if intermixed else p.parse_args)(argv)


def key_help(config: type, name: str, note: str = "") -> str:
    """A flag's help read from its typed config's field (`Params.doc`, `Params.defaults`): one source for both."""
    default = config.defaults().get(name)
    if default is None:
        shown = "none"
    else:
        shown = f"{default:,}" if isinstance(default, int) and not isinstance(default, bool) else str(default)
    return f"{config.doc(name)} (default {shown}{'; ' + note if note else ''})"
