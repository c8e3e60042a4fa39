#!/usr/bin/env python
"""`oodforge make-tiny` from a checkout (`python scripts/make_tiny.py --help`); the command lives in oodforge/commands/make_tiny.py."""
from oodforge.commands.make_tiny import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
