#!/usr/bin/env python
"""`oodforge pack-shards` run from a checkout; the command is oodforge.commands.pack_shards."""
from oodforge.commands.pack_shards import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
