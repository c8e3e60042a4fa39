"""Auxiliary-diversity study (Open-Insects Figure 4): one method at a fixed auxiliary image budget for several numbers
of auxiliary species, AUROC per OOD set against the count.

    oodforge aux-study --config configs/species_ne-america.yaml --method novel_branch \\
        --budget 80000 --species 100,1000,8000 --out runs/aux_study [key=value ...]

For each count K the config's `aux` rows (split `train`, or the config's `aux.split`) are subsampled deterministically
(`--seed`: K species, budget / K images each; a smaller count's species are among a larger one's) into OUT/species_K/aux
and `oodforge evaluate` runs the config with that `aux`, only `--method` (its entry in the config, rules included),
into OUT/species_K. A count whose run finished on the same subsample and config is reused; an unfinished one resumes
(the runner skips finished units). Writes OUT/aux_study.csv (species, images, ood_set, method, auroc) and
OUT/aux_study.png (and .pdf with `--figures pdf`; none with `--figures none`). Every count and the config (evaluate's
checks) are checked before the first run; a count whose evaluation fails is recorded (OUT/aux_study_failures.json, exit
1) and the others go on. `--dry-run` runs those checks and prints each count's subsample and state (new, resumes,
reused); nothing written.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from detectors.harness.report.aux_study import (
    aux_rows,
    study_figure,
    study_title,
    subsample,
    subsample_digest,
    write_subsample,
)
from detectors.harness.report.figures import save_figure
from detectors.harness.report.open_insects import study_table
from detectors.harness.report.write import FIGURES
from detectors.harness.runconfig import DetectorSpec, EvalConfig
from oodforge.args import command_parser, load_config
from pipelines.cli import comma_list
from pipelines.errors import UserInputError
from pipelines.io import atomic_write_json, atomic_write_text

DOC = "docs/report.md"
"""Where the command's inputs are documented (named in its one-line errors)."""
FLAGS: dict[str, str] = {}
"""The command's flags as shorthands of its (evaluation) config's keys: none (its flags are the study's own)."""


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(v) for v in comma_list(text)})
    except ValueError:
        raise UserInputError(f"--species: comma-separated whole numbers, got {text!r}") from None
    if not counts or counts[0] < 1:
        raise UserInputError(f"--species: positive counts, got {text!r}")
    return counts


def _method_entry(config: EvalConfig, method: str) -> DetectorSpec:
    """The config's entry of `method` (rules and parameters included), else its defaults."""
    for spec in config.detectors if config.detectors != "all" else []:
        if spec.name == method:
            return spec
    return DetectorSpec.from_value(method, "--method")


def _aux_source(config: EvalConfig, where: str) -> tuple[str, str]:
    if config.aux is None:
        raise UserInputError(f"{where}: `aux` is not set: the study subsamples the config's auxiliary rows")
    return config.aux.manifest, config.aux.split or "train"


def build_parser():
    p = command_parser(__name__, __doc__, config="required", dry_run=True)
    p.add_argument("--method", required=True, help="the detector to study (its config entry is used when present)")
    p.add_argument("--species", required=True, type=_counts, help="comma-separated numbers of auxiliary species")
    p.add_argument("--budget", required=True, type=int, help="auxiliary images per run (the paper: 80000)")
    p.add_argument("--out", required=True, type=Path, help="study folder: one run folder per count")
    p.add_argument("--seed", type=int, default=0, help="subsampling seed (default 0)")
    p.add_argument("--figures", default="png", choices=list(FIGURES),
                   help="png (default), pdf (also a publication PDF) or none (the table only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_config(EvalConfig, args, FLAGS)
    manifest, split = _aux_source(config, str(args.config))
    source = aux_rows(manifest, split)
    entry = _method_entry(config, args.method).to_dict()
    config_key = hashlib.sha256(json.dumps([str(Path(args.config).resolve()), args.overrides, entry],
                                           sort_keys=True, default=str).encode()).hexdigest()
    # every count checked
    drawn = {count: subsample(source.rows, count, args.budget, args.seed) for count in args.species}
    _check_config(config, entry, args.out)
    if args.dry_run:
        for count, rows in drawn.items():
            run = args.out / f"species_{count}"
            key = {"subsample": subsample_digest(source, rows), "config": config_key}
            state = "finished run reused" if _reused(run, key) else ("resumes" if run.is_dir() else "new")
            print(f"species {count}: {len(rows)} images, {len({r['aux_label'] for r in rows})} species -> {run} "
                  f"({state})")
        print("dry run: every check passed; nothing written")
        return 0
    runs, failed = {}, {}
    for count, rows in drawn.items():
        run = args.out / f"species_{count}"
        digest = write_subsample(source, rows, run / "aux")
        done = run / "aux_study_done.json"
        key = {"subsample": digest, "config": config_key}
        if _reused(run, key):
            print(f"species {count}: finished run reused ({run})")
        else:
            print(f"species {count}: evaluating into {run}")
            overrides = [*args.overrides,
                         f"aux={json.dumps({'manifest': str((run / 'aux').resolve()), 'split': split})}",
                         f"out={run}", f"detectors={json.dumps([entry])}"]
            done.unlink(missing_ok=True)
            finished = subprocess.run([sys.executable, "-m", "oodforge", "evaluate", "--config", str(args.config),
                                       *overrides])
            if finished.returncode != 0:  # recorded; the other counts go on
                failed[count] = f"exit {finished.returncode}"
                print(f"species {count}: the evaluation failed (exit {finished.returncode}); the other counts go on",
                      file=sys.stderr)
                continue
            atomic_write_json(done, key)
        runs[count] = run / "results.csv"
    if failed:
        atomic_write_json(args.out / "aux_study_failures.json", failed)
    else:
        (args.out / "aux_study_failures.json").unlink(missing_ok=True)
    if not runs:
        raise UserInputError(f"aux study: every count's evaluation failed ({failed}); see their run folders under "
                             f"{args.out}")
    table = study_table(runs, args.method)
    atomic_write_text(args.out / "aux_study.csv", table.to_csv(index=False))
    written = [args.out / "aux_study.csv"]
    if FIGURES[args.figures]:
        written.append(save_figure(study_figure(table, study_title(table)), args.out / "aux_study.png",
                                   FIGURES[args.figures]))
    print(table.to_string(index=False))
    print(f"wrote {' and '.join(map(str, written))}")
    if failed:
        print(f"error: the evaluation of {len(failed)} count(s) failed ({', '.join(map(str, failed))} species): the "
              f"table holds the others; rerun to resume them ({args.out / 'aux_study_failures.json'})", file=sys.stderr)
        return 1
    return 0


def _reused(run: Path, key: dict[str, str]) -> bool:
    """True when `run` holds a finished evaluation under `key` (its subsample's digest and the config's)."""
    done = run / "aux_study_done.json"
    return done.is_file() and json.loads(done.read_text(encoding="utf-8")) == key and (run / "results.csv").is_file()


def _check_config(config: EvalConfig, entry: dict, out: Path) -> None:
    """The checks `oodforge evaluate --dry-run` runs, on the config as each count's run gets it (only the studied
    method; the config's own auxiliary rows stand in for their subsamples): a bad config is one line before any run."""
    from detectors.harness.plan import make_plan

    make_plan(EvalConfig.from_dict({**config.to_dict(), "detectors": [entry], "out": str(out / "check")}))
