#!/usr/bin/env python
"""`oodforge report` from a checkout (`python scripts/report.py --help`); the command lives in oodforge/commands/report.py."""
from oodforge.commands.report import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
