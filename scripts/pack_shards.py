#!/usr/bin/env python
"""`oodforge pack-shards` from a checkout (`python scripts/pack_shards.py --help`); the command lives in oodforge/commands/pack_shards.py."""
from oodforge.commands.pack_shards import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
