#!/usr/bin/env python
"""`oodforge evaluate` run from a checkout; the command is oodforge.commands.evaluate."""
from oodforge.commands.evaluate import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
