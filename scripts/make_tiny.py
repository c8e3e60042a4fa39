#!/usr/bin/env python
"""`oodforge make-tiny` run from a checkout; the command is oodforge.commands.make_tiny."""
from oodforge.commands.make_tiny import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
