#!/usr/bin/env python
"""Run detectors on an ID manifest and OOD manifests: `python scripts/evaluate.py --config eval.yaml [--out DIR]`.

Writes results.csv, scores.parquet, failures.json (and threshold_transfer.csv) to the config's `out` folder and prints
the summary table. Works under `accelerate launch` (feature extraction is split across processes).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from detectors.evaluate import EvalConfig, Runner, dump_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML config (see README: Evaluation)")
    parser.add_argument("--out", help="override the config's output folder")
    parser.add_argument("--detectors", help="comma-separated detector names (overrides the config)")
    args = parser.parse_args(argv)
    config = EvalConfig.from_yaml(args.config)
    if args.out:
        config.out = args.out
    if args.detectors:
        config.detectors = [d.strip() for d in args.detectors.split(",") if d.strip()]
    results = Runner(config).run()
    from pipelines.runtime import partial_state

    state = partial_state()
    if state.num_processes > 1:  # every rank done before the group is torn down
        import torch.distributed as dist

        state.wait_for_everyone()
        dist.destroy_process_group()
    if not state.is_main_process:
        return
    dump_config(config, Path(config.out) / "config.yaml")
    from detectors.report import render_summary

    print(render_summary(results))
    print(f"\nwrote {Path(config.out) / 'results.csv'} and {Path(config.out) / 'scores.parquet'}")


if __name__ == "__main__":
    main()
