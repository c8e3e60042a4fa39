#!/usr/bin/env python
"""`oodforge curate-containers` run from a checkout; the command is oodforge.commands.curate_containers."""
from oodforge.commands.curate_containers import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
