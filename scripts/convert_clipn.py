#!/usr/bin/env python
"""`oodforge convert-clipn` from a checkout (`python scripts/convert_clipn.py --help`); the command lives in oodforge/commands/convert_clipn.py."""
from oodforge.commands.convert_clipn import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
