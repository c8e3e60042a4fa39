"""The `oodforge` command: `oodforge <command> [options]`, one subcommand per module of `oodforge.commands`.

`oodforge --help` lists the commands by group with the first line of each module's docstring, read without importing
it (so the listing is instant); `oodforge <command> --help` shows that command's options. A command runs through
`pipelines.cli.run_main`: bad input is one line and exit status 2.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from pipelines.cli import run_main
from pipelines.errors import closest

GROUPS: dict[str, tuple[str, ...]] = {
    "data": ("import-folder", "import-openood", "import-open-insect", "fetch-images", "make-splits",
             "curate-containers", "pack-shards"),
    "train": ("train-classifier", "train-prompts", "convert-clipn"),
    "generate": ("generate",),
    "evaluate": ("evaluate", "aux-study"),
    "report": ("report", "feature-map"),
    "tools": ("demo", "make-tiny"),
}
"""Every command, by group, in the order `oodforge --help` lists them."""
COMMANDS: tuple[str, ...] = tuple(name for names in GROUPS.values() for name in names)


def module_name(command: str) -> str:
    """`fetch-images` -> `oodforge.commands.fetch_images`."""
    return f"oodforge.commands.{command.replace('-', '_')}"


def summary(command: str) -> str:
    """The head of a command's module docstring (up to its first colon, 90 characters at most), read from its
    source without importing it."""
    spec = importlib.util.find_spec(module_name(command))
    assert spec is not None and spec.origin is not None, command
    with open(spec.origin, encoding="utf-8") as source:
        doc = ast.get_docstring(ast.parse(source.read())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").split(": ")[0].split(" (`")[0].rstrip(".:")
    return first if len(first) <= 90 else first[:first.rfind(" ", 0, 87)] + " ..."


def usage() -> str:
    """The `oodforge --help` text."""
    width = max(map(len, COMMANDS))
    lines = ["usage: oodforge <command> [options]   (oodforge <command> --help: its options)", ""]
    for group, names in GROUPS.items():
        lines.append(f"{group}:")
        lines += [f"  {name:<{width}}  {summary(name)}" for name in names]
    lines += ["", "Every command takes --config FILE and key=value overrides (docs/cli.md lists every flag).",
              "Also: python -m oodforge <command>; accelerate launch -m oodforge evaluate ... (several processes)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from oodforge import __version__

        print(f"oodforge {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        hint = closest(command.replace("_", "-"), list(COMMANDS))
        print(f"error: unknown command {command!r}{hint}; `oodforge --help` lists the commands", file=sys.stderr)
        return 2
    module = importlib.import_module(module_name(command))
    return run_main(module.main, rest, doc=module.DOC)
