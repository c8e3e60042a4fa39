"""Evaluate's units in 1 process against 2 (`torchrun --nproc_per_node 2`, gloo on the CPU): the wall time of the units
phase (`Runner.units_seconds`: from the end of feature preparation until every rank's units are done, on the main
process), each process with one BLAS thread (as torchrun gives them), and the two runs' outputs compared.

The run: the embedded digits data (`pipelines.toydata`), a tiny ResNet classifier with random weights, every post-hoc
detector (`detectors: all`), feature caches built once beforehand in a shared `cache_dir` (both runs reuse them, so
the units are what differs). The 1- and 2-process runs alternate for `--repeats` rounds (the machine may be shared:
the spread of the ratios is reported with their median).

    python -m benchmarks.scale_units                 # 3 rounds -> benchmarks/scale_units.json
    python -m benchmarks.scale_units --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).with_suffix(".json")


def child(config_path: str, timing_path: str) -> None:
    """Under torchrun or alone: run the evaluation, timing each unit on the rank that runs it (`Runner._unit`, write
    included); every rank writes its unit times, the main process the units phase's wall time."""
    import time

    from detectors.harness.evaluate import Runner
    from pipelines.runtime import partial_state

    runner = Runner(config_path)
    unit_s: dict[str, float] = {}
    run_unit = runner._unit

    def timed(unit: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return run_unit(unit, *args, **kwargs)
        finally:
            unit_s[unit.method] = round(time.perf_counter() - start, 3)

    runner._unit = timed  # type: ignore[method-assign]
    runner.run()
    state = partial_state()
    Path(f"{timing_path}.rank{state.process_index}").write_text(json.dumps({"unit_s": unit_s}))
    if state.is_main_process:
        Path(timing_path).write_text(json.dumps({"units_s": runner.units_seconds}))


def _launch(config: dict[str, Any], folder: Path, processes: int) -> tuple[float, list[dict[str, float]]]:
    """(the units phase's wall time, each rank's unit wall times) of one run in `processes` processes."""
    path, timing = folder / f"run-{processes}.yaml", folder / f"timing-{processes}.json"
    path.write_text(yaml.safe_dump(config))
    launch = ([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", str(processes)]
              if processes > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launch, "-m", "benchmarks.scale_units", "--child", str(path), str(timing)],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
    ranks = [json.loads(Path(f"{timing}.rank{r}").read_text())["unit_s"] for r in range(processes)]
    return float(json.loads(timing.read_text())["units_s"]), ranks


def _setup(root: Path) -> dict[str, Any]:
    """The digits data, a tiny random-weight classifier and the config (caches under `root/cache`)."""
    import torch
    from transformers import ResNetForImageClassification

    from pipelines.toydata import tiny_digit_classifier_config, write_digits

    id_dir, ood_dir = write_digits(root, n_textures=200)
    torch.manual_seed(0)
    config, processor = tiny_digit_classifier_config()
    ResNetForImageClassification(config).save_pretrained(root / "clf")
    processor.save_pretrained(root / "clf")
    return {"model": str(root / "clf"), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}],
            "cache_dir": str(root / "cache"), "detectors": "all", "families": ["posthoc"], "num_workers": 0}


def _rows(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv").drop(columns=["seconds"])


def measure(repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = _setup(root)
        _launch({**config, "out": str(root / "warm")}, root, 1)  # builds the feature caches both runs reuse
        one_s, two_s, equal, ranks_s, loads = [], [], True, {}, [os.getloadavg()[0]]
        for round_ in range(repeats):
            for processes in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                out = root / f"out-{round_}-{processes}"
                seconds, ranks_s[processes, round_] = _launch({**config, "out": str(out)}, root, processes)
                (one_s if processes == 1 else two_s).append(seconds)
                loads.append(os.getloadavg()[0])
            one, two = _rows(root / f"out-{round_}-1"), _rows(root / f"out-{round_}-2")
            equal = equal and one.equals(two)
            scores = [pd.read_parquet(root / f"out-{round_}-{p}" / "scores.parquet") for p in (1, 2)]
            equal = equal and scores[0].equals(scores[1])
    per_unit = ranks_s[1, 0][0]  # each unit's wall time (fit, every set scored, written) in one process
    ranks = [sorted(mine) for mine in ranks_s[2, 0]]
    ratios = [a / b for a, b in zip(one_s, two_s)]
    return {"unit_seconds_one_process": per_unit, "unit_seconds_sum_one_process": round(sum(per_unit.values()), 3),
            "units_per_rank": ranks,
            "unit_seconds_per_rank_from_one_process": [round(sum(per_unit[m] for m in mine), 3) for mine in ranks],
            "unit_seconds_per_rank_measured": [[round(sum(r.values()), 3) for r in ranks_s[2, k]]
                                               for k in range(repeats)],
            "one_process_s": one_s, "two_processes_s": two_s, "speedup": ratios,
            "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
            "outputs_equal": equal, "repeats": repeats, "load_average_1min": [round(x, 2) for x in loads],
            "cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of 1 then 2 processes (alternating order)")
    parser.add_argument("--out", default=str(OUT), help="the JSON written (default: beside this file)")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "TIMING"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    result = measure(args.repeats)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"units: 1 process {statistics.median(result['one_process_s']):.1f} s, 2 processes "
          f"{statistics.median(result['two_processes_s']):.1f} s (medians of {args.repeats}); speed-up "
          f"{result['speedup_median']:.2f}x (min {result['speedup_min']:.2f}, max {result['speedup_max']:.2f}); "
          f"outputs equal: {result['outputs_equal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
