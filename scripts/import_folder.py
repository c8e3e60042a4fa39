#!/usr/bin/env python
"""`oodforge import-folder` from a checkout (`python scripts/import_folder.py --help`); the command lives in oodforge/commands/import_folder.py."""
from oodforge.commands.import_folder import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
