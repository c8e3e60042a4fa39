#!/usr/bin/env python
"""`oodforge report` run from a checkout; the command is oodforge.commands.report."""
from oodforge.commands.report import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
