#!/usr/bin/env python
"""`oodforge import-folder` run from a checkout; the command is oodforge.commands.import_folder."""
from oodforge.commands.import_folder import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
