#!/usr/bin/env python
"""`oodforge demo` run from a checkout; the command is oodforge.commands.demo."""
from oodforge.commands.demo import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
