"""`python -m oodforge <command> ...` (and `accelerate launch -m oodforge evaluate ...`): the `oodforge` command."""
from oodforge.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
