#!/usr/bin/env python
"""`oodforge fetch-images` run from a checkout; the command is oodforge.commands.fetch_images."""
from oodforge.commands.fetch_images import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
