#!/usr/bin/env python
"""`oodforge train-prompts` run from a checkout; the command is oodforge.commands.train_prompts."""
from oodforge.commands.train_prompts import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
