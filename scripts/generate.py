"""Generate hard OOD images by ZeST material transfer: `python scripts/generate.py --config gen.yaml [key=value ...]`.

Multi-GPU: `accelerate launch --num_processes N scripts/generate.py --config gen.yaml`; two CPU processes:
`torchrun --nproc_per_node 2 scripts/generate.py --config gen.yaml`. Rerun the same command to resume.
Overrides use the config's keys (`batch_size=4`, `limit=100`, `models.vae=DIR`); `--dry-run` prints the plan only
(and refuses, naming the changes, when the input folders changed since the job's plan was stored).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from gen.job import GenerationConfig, format_plan, job_plan, plan_summary, run_generation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, type=Path, help="YAML generation config (see configs/gen_*.yaml)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, values parsed as YAML")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and counts without loading models")
    parser.add_argument("--show", type=int, default=20, help="plan lines to print with --dry-run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = GenerationConfig.from_yaml(args.config, args.overrides)
    if args.dry_run:
        plan = job_plan(config)
        print(format_plan(plan.items, args.show))
        print(json.dumps(plan_summary(config, plan), indent=2))
        return
    summary = run_generation(config)
    if "manifest" in summary:
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
