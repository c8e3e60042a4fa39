#!/usr/bin/env python
"""`oodforge import-openood` run from a checkout; the command is oodforge.commands.import_openood."""
from oodforge.commands.import_openood import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
