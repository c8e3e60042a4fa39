#!/usr/bin/env python
"""`oodforge evaluate` from a checkout (`python scripts/evaluate.py --help`); the command lives in oodforge/commands/evaluate.py."""
from oodforge.commands.evaluate import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
