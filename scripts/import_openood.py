#!/usr/bin/env python
"""`oodforge import-openood` from a checkout (`python scripts/import_openood.py --help`); the command lives in oodforge/commands/import_openood.py."""
from oodforge.commands.import_openood import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
