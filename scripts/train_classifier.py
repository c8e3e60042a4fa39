#!/usr/bin/env python
"""`oodforge train-classifier` from a checkout (`python scripts/train_classifier.py --help`); the command lives in oodforge/commands/train_classifier.py."""
from oodforge.commands.train_classifier import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
