#!/usr/bin/env python
"""`oodforge demo` from a checkout (`python scripts/demo.py --help`); the command lives in oodforge/commands/demo.py."""
from oodforge.commands.demo import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
