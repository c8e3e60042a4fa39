#!/usr/bin/env python
"""`oodforge train-classifier` run from a checkout; the command is oodforge.commands.train_classifier."""
from oodforge.commands.train_classifier import DOC, main
from pipelines.cli import run_main

if __name__ == "__main__":
    raise SystemExit(run_main(main, doc=DOC))
