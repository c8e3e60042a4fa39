#!/usr/bin/env python
"""`oodforge generate` run from a checkout; the command is oodforge.commands.generate."""
from oodforge.commands.generate import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
