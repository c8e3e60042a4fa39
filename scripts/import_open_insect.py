#!/usr/bin/env python
"""`oodforge import-open-insect` run from a checkout; the command is oodforge.commands.import_open_insect."""
from oodforge.commands.import_open_insect import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
