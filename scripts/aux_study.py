#!/usr/bin/env python
"""`oodforge aux-study` from a checkout (`python scripts/aux_study.py --help`); the command lives in oodforge/commands/aux_study.py."""
from oodforge.commands.aux_study import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
