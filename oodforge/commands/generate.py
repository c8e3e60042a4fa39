"""Generate hard OOD images by ZeST material transfer: `oodforge generate --config gen.yaml [key=value ...]`.

Multi-GPU: `accelerate launch --num_processes N -m oodforge generate --config gen.yaml`; two CPU processes:
`torchrun --nproc_per_node 2 -m oodforge generate --config gen.yaml`. Rerun the same command to resume.
Overrides use the config's keys (`batch_size=4`, `limit=100`, `models.vae=DIR`); `--dry-run` prints the plan only
and runs every start-up check of the run (it refuses, in the same one line, where the run would). Config errors and
changed inputs print one line and exit with status 2 (`--debug` shows the traceback).
"""
from __future__ import annotations

import json
import sys
from typing import Any

from gen.job import JOB_FOLDER, GenerationConfig, check_job, format_plan, plan_summary, run_generation
from oodforge.args import command_parser, load_config
from pipelines.cli import README_SECTIONS

DOC = README_SECTIONS["generation"]
"""Where the command's inputs are documented (named in its one-line errors)."""
FLAGS: dict[str, str] = {}
"""The command's flags as shorthands of its config's keys (docs/cli.md): none, every key is a `key=value`."""


def describe_plan(summary: dict[str, Any], out: str) -> str:
    """The dry run's counts (`gen.job.plan_summary`) as lines a person reads: items, targets and materials, how often
    a material is used, what is done, the inputs skipped and the plan's warnings."""
    low, high = summary["material_use"]
    use = f"{low} time(s)" if low == high else f"{low} to {high} times"
    lines = [f"plan: {summary['planned']:,} item(s) of task {summary['task']} (OOD set {summary['ood_set']}) from "
             f"{summary['targets']:,} target(s) and {summary['materials']:,} material(s), each material used {use}",
             f"already done: {summary['already_done']:,}; to generate: {summary['pending']:,}"
             + (f" ({summary['extended']:,} added to the stored plan)" if summary.get("extended") else "")]
    skipped = summary.get("skipped_inputs") or []
    if skipped:
        first = skipped[0]
        lines.append(f"skipped inputs: {len(skipped):,} (first: {first['file']}, line {first['line']}, "
                     f"{first['field']}: {first['reason']})")
    lines += [f"warning: {warning}" for warning in summary.get("warnings", [])]
    lines.append(f"dry run: every start-up check passed; nothing written to {out}")
    return "\n".join(lines)


def build_parser():
    p = command_parser(__name__, __doc__, config="required", dry_run=True)
    p.add_argument("--show", type=int, default=20, help="plan lines to print with --dry-run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_config(GenerationConfig, args, FLAGS)
    if args.dry_run:
        plan = check_job(config)  # every start-up check of the run: where the run would refuse, so does this
        print(format_plan(plan.items, args.show))
        print(describe_plan(plan_summary(config, plan), config.out))
        return 0
    summary = run_generation(config)
    if "manifest" in summary:
        print(json.dumps(summary, indent=2))
        done, skipped = summary["done"], summary["skipped"]  # done: every finished item; skipped: finished before
        failed = summary["failed"]
        print(f"generate: {done - skipped} done, {len(failed)} failed, {skipped} skipped (finished "
              f"before); {done} of {summary['planned']} planned in the manifest", file=sys.stderr)
        if failed and not done:  # nothing to keep: the run failed, whatever its counts say
            first = failed[0]
            print(f"error: every planned item failed ({len(failed)}); the first, {first['file']} "
                  f"({first['stage']}): {first['reason']} -> {config.out}/{JOB_FOLDER}/summary.json", file=sys.stderr)
            return 1
    return 0
