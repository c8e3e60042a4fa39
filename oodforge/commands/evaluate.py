"""Run detectors on an ID manifest and OOD manifests: `oodforge evaluate --config eval.yaml [key=value ...]`.

Writes results.csv, scores.parquet, failures.json (and threshold_transfer.csv, rule_selection.csv) to the config's
`out` folder and prints the summary table. `--dry-run` runs every check the run runs before its first model loads
(the typed config, overrides included, then the data), prints the plan (units to run and to reuse, caches, warnings)
and exits; both exit 2 with one line naming the key where the config is refused. Works under `accelerate launch` or
`torchrun` (feature extraction is split across processes).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from oodforge.args import command_parser, load_config
from pipelines.cli import README_SECTIONS

DOC = README_SECTIONS["config"]
"""Where the command's inputs are documented (named in its one-line errors)."""


def cpu_launch(processes: int | str) -> str:
    """The commands that start `processes` CPU processes: torchrun, or accelerate's multi-process launcher (its
    `--multi_gpu` runs torchrun; without a GPU every process runs on the CPU over gloo; `--cpu` would start one)."""
    return (f"torchrun --nproc_per_node {processes} -m oodforge evaluate ...` or `accelerate launch --multi_gpu "
            f"--num_processes {processes} -m oodforge evaluate ...")


def _process_warning(running: int) -> str | None:
    """A warning when the launcher asked for more processes than are running (accelerate on CPU falls back to one)."""
    for var in ("ACCELERATE_NUM_PROCESSES", "WORLD_SIZE"):
        try:
            asked = int(os.environ.get(var, "") or 0)
        except ValueError:
            continue
        if asked > running:
            return (f"warning: {asked} processes were asked for ({var}={asked}) but {running} running; on CPU launch "
                    f"with `{cpu_launch(asked)}`")
    simple = "ACCELERATE_USE_CPU" in os.environ and "MASTER_PORT" in os.environ and "WORLD_SIZE" not in os.environ
    if simple and running == 1:  # `accelerate launch --num_processes N` without a distributed backend (CPU)
        return ("warning: accelerate was asked for several processes but 1 is running (`--cpu` selects its simple "
                f"launcher, which starts one); launch with `{cpu_launch('N')}`")
    return None


def _finish_processes() -> bool:
    """Every rank done before the process group is torn down; True on the main process."""
    from pipelines.runtime import partial_state

    state = partial_state()
    if state.num_processes > 1:
        import torch.distributed as dist

        state.wait_for_everyone()
        dist.destroy_process_group()
    return state.is_main_process


FLAGS = {"--out": "out"}
"""The command's flags as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    return command_parser(__name__, __doc__, config="required", out=True, dry_run=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from detectors.harness.evaluate import EvalConfig, Runner, dump_config
    from detectors.harness.plan import make_plan
    from detectors.harness.units import UnitStore

    config = load_config(EvalConfig, args, FLAGS)
    plan = make_plan(config)
    if args.dry_run:
        store = UnitStore(plan.out)
        print(plan.describe(u.method for u in plan.units if store.finished(u.method, u.key) is not None))
        return 0
    from pipelines.runtime import partial_state

    for warning in [*(f"warning: {w}" for w in plan.warnings), _process_warning(partial_state().num_processes)]:
        if warning:
            print(warning, file=sys.stderr)
    runner = Runner(plan)
    results = runner.run()
    if not _finish_processes():
        return 0
    return _report(config, results, runner, dump_config)


def _report(config, results, runner, dump_config) -> int:
    out = Path(config.out)
    dump_config(config, out / "config.yaml")
    if results.empty:
        n = len(runner.detector_failures)
        print(f"error: no results: {'every detector failed' if n else 'nothing ran'} ({n} failure(s)) -> "
              f"{out / 'failures.json'}", file=sys.stderr)
        return 1
    from detectors.harness.report import render_summary

    print(render_summary(results))
    accuracy = results.dropna(subset=["id_acc"]).drop_duplicates("method")
    if len(accuracy):
        print("ID test accuracy: " + ", ".join(f"{m} {100 * a:.2f}%" for m, a in zip(accuracy["method"],
                                                                                     accuracy["id_acc"])))
    print(f"\nwrote {out / 'results.csv'} and {out / 'scores.parquet'}")
    return 0
