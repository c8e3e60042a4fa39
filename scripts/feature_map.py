#!/usr/bin/env python
"""`oodforge feature-map` from a checkout (`python scripts/feature_map.py --help`); the command lives in oodforge/commands/feature_map.py."""
from oodforge.commands.feature_map import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
