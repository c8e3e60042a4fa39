"""Command-line options as typed configs: values read as YAML 1.2 reads them, and a ConfigError's dotted key turned
back into the flag the user typed (`split.id_fractions: ...` -> `--id-fractions: ...`)."""
from __future__ import annotations

from typing import Any

from pipelines.cli import parse_yaml
from pipelines.errors import ConfigError


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
