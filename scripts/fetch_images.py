#!/usr/bin/env python
"""`oodforge fetch-images` from a checkout (`python scripts/fetch_images.py --help`); the command lives in oodforge/commands/fetch_images.py."""
from oodforge.commands.fetch_images import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
