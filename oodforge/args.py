"""The one command-line style of `oodforge <command>`: the shared flags, `--config FILE` plus `key=value` overrides
over the command's typed config, and deprecated spellings that still work (docs/cli.md lists every flag).

Two kinds of command: one with a typed config (fetch-images, make-splits, pack-shards, curate-containers, evaluate,
...) reads the config file and the overrides as that config's keys (`config_raw`) and lays its flags over them; one
without (report, feature-map, ...) takes its flags' own names as the keys (`parse`: `top_k: 4` in the file or
`top_k=4` is `--top-k 4`, typed and checked as the flag is; a flag typed on the command line wins).
"""
from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.cli import comma_list
from pipelines.cli import parser as base_parser
from pipelines.configfile import apply_overrides, display_path, load_yaml
from pipelines.errors import ConfigError, closest
from pipelines.params import C

log = logging.getLogger(__name__)
_warned: set[str] = set()


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


class _Deprecated(argparse.Action):
    """A hidden old spelling of another flag: does what that flag does and warns once."""

    def __init__(self, option_strings: list[str], dest: str, target: argparse.Action, **kwargs: Any):
        super().__init__(option_strings, target.dest, nargs=target.nargs, type=target.type, choices=target.choices,
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS, metavar=target.metavar)
        self.target = target

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        new = self.target.option_strings[-1]
        if option_string not in _warned:
            _warned.add(str(option_string))
            log.warning("%s %s is deprecated: use %s", parser.prog, option_string, new)
        self.target(parser, namespace, values, new)


def deprecated(p: argparse.ArgumentParser, old: str, new: str) -> None:
    """Add `old` as a hidden, warning spelling of the flag `new` (already added)."""
    target = next(a for a in p._actions if new in a.option_strings)
    p.add_argument(old, action=_Deprecated, target=target)


def deprecated_flags(p: argparse.ArgumentParser) -> dict[str, str]:
    """{old spelling: new} of the parser's deprecated aliases."""
    return {o: a.target.option_strings[-1] for a in p._actions if isinstance(a, _Deprecated) for o in a.option_strings}


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
    return cls.from_yaml(getattr(args, "config", None), getattr(args, "overrides", None), given)


def _plain(value: Any) -> Any:
    """A parsed flag value as config data: paths as strings (in lists too)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def config_raw(args: argparse.Namespace) -> dict[str, Any]:
    """The `--config` file (none: an empty mapping) with the `key=value` overrides applied."""
    if getattr(args, "config", None) is not None:
        return load_yaml(args.config, args.overrides)
    return apply_overrides({}, getattr(args, "overrides", None))


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None, intermixed: bool = False,
          typed: bool = False) -> argparse.Namespace:
    """Parse `argv` (`intermixed`: positionals and flags in any order). `typed`: the config's keys are left to the
    command's typed config (`config_raw`). Else they are the flags' own names (`dest`): each key becomes its flag
    before the command line's, so the flag typed wins and every value is typed and checked as that flag is; an
    unknown key (or one naming a positional argument) is one ConfigError."""
    _overrides_last(p)
    read = p.parse_intermixed_args if intermixed else p.parse_args
    if typed:
        return read(argv)
    required = [a for a in p._actions if a.required and a.option_strings]
    for action in required:  # a required flag may come from the config: the second reading checks it
        action.required = False
    try:
        args = read(argv)
    finally:
        for action in required:
            action.required = True
    raw = config_raw(args)
    if not raw:
        return read(argv) if required else args
    where = display_path(args.config) if args.config is not None else "override"
    flags = {a.dest: a for a in p._actions if a.option_strings and a.help is not argparse.SUPPRESS
             and a.dest not in ("help", "config", "debug")}
    tokens: list[str] = []
    for key, value in raw.items():
        action = flags.get(str(key).replace("-", "_"))
        if action is None:
            raise ConfigError(f"{where}: unknown key {key!r}{closest(str(key), sorted(flags))}")
        tokens += _tokens(action, value, f"{where}: {key}")
    return read([*tokens, *(argv or [])])


def _overrides_last(p: argparse.ArgumentParser) -> None:
    """Move the `key=value` positional behind the command's own positionals (`make-tiny clip --out DIR seed=1`)."""
    for actions in (p._actions, *(g._group_actions for g in p._action_groups)):
        found = [a for a in actions if a.dest == "overrides"]
        for action in found:
            actions.remove(action)
            actions.append(action)


def _tokens(action: argparse.Action, value: Any, where: str) -> list[str]:
    """The command-line spelling of `value` for `action`."""
    flag = action.option_strings[-1]
    if value is None:
        return []
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: true or false, got {value!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if value else "--no-" + flag[2:]]
        return [flag] if value == bool(action.const) else []
    values = value if isinstance(value, list) else [value]
    if action.type is comma_list:
        return [flag, ",".join(map(str, values))]
    if isinstance(action, argparse._AppendAction):
        return [t for v in values for t in (flag, str(v))]
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        return [flag, *map(str, values)]
    if isinstance(value, list):
        raise ConfigError(f"{where}: one value, got a list")
    return [flag, str(value)]


def key_help(config: type, name: str, note: str = "") -> str:
    """A flag's help read from its typed config's field (`Params.doc`, `Params.defaults`): one source for both."""
    default = config.defaults().get(name)
    if default is None:
        shown = "none"
    else:
        shown = f"{default:,}" if isinstance(default, int) and not isinstance(default, bool) else str(default)
    return f"{config.doc(name)} (default {shown}{'; ' + note if note else ''})"
