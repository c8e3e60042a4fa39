#!/usr/bin/env python
"""`oodforge curate-containers` from a checkout (`python scripts/curate_containers.py --help`); the command lives in oodforge/commands/curate_containers.py."""
from oodforge.commands.curate_containers import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
