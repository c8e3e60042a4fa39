#!/usr/bin/env python
"""`oodforge convert-clipn` run from a checkout; the command is oodforge.commands.convert_clipn."""
from oodforge.commands.convert_clipn import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
