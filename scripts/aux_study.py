#!/usr/bin/env python
"""`oodforge aux-study` run from a checkout; the command is oodforge.commands.aux_study."""
from oodforge.commands.aux_study import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
