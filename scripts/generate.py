#!/usr/bin/env python
"""`oodforge generate` from a checkout (`python scripts/generate.py --help`); the command lives in oodforge/commands/generate.py."""
from oodforge.commands.generate import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
