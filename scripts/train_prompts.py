#!/usr/bin/env python
"""`oodforge train-prompts` from a checkout (`python scripts/train_prompts.py --help`); the command lives in oodforge/commands/train_prompts.py."""
from oodforge.commands.train_prompts import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
