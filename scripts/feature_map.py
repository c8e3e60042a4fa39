#!/usr/bin/env python
"""`oodforge feature-map` run from a checkout; the command is oodforge.commands.feature_map."""
from oodforge.commands.feature_map import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
