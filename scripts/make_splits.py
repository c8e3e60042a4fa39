#!/usr/bin/env python
"""`oodforge make-splits` from a checkout (`python scripts/make_splits.py --help`); the command lives in oodforge/commands/make_splits.py."""
from oodforge.commands.make_splits import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
