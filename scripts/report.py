#!/usr/bin/env python
"""Render a run into a report: `python scripts/report.py --results RUN/results.csv --out RUN/report`.

Reads results.csv and, when they lie beside it, scores.parquet, threshold_transfer.csv and rule_selection.csv. Writes
Table 3 / per-set / Table 4 / family tables (md, tex, csv), the best rule per training method, the threshold-transfer
table, FPR@95 by family, AUROC and FPR@95 heatmaps, ROC curves per set, score densities per method, bootstrap intervals
(`--bootstrap N`), AUROC per taxonomic hop, the field report per novel species, the most ID-looking OOD images, and
index.html showing them all (see docs/report.md). Prints the summary and a warning per set with AUROC below 50.
"""
from __future__ import annotations

import sys
from pathlib import Path

from detectors.report import companion_files, render_summary, write_report
from pipelines.cli import comma_list, parser as cli_parser, run_main


def build_parser():
    p = cli_parser(__doc__)
    p.add_argument("--results", required=True, type=Path, help="results table (.csv or .parquet), one row per (method, ood_set)")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--methods", type=comma_list, default=None, help="comma-separated methods to report (default: all)")
    p.add_argument("--scores", type=Path, default=None,
                   help="per-sample scores .parquet (default: scores.parquet beside --results, if any)")
    p.add_argument("--threshold-transfer", type=Path, default=None,
                   help="threshold-transfer .csv (default: threshold_transfer.csv beside --results, if any)")
    p.add_argument("--rule-selection", type=Path, default=None,
                   help="the runner's rule choice on validation (default: rule_selection.csv beside --results, if any)")
    p.add_argument("--bootstrap", type=int, default=0, metavar="N",
                   help="bootstrap replicates for 95%% intervals of AUROC and FPR@95 (default 0: none)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--top-k", type=int, default=8, help="most ID-looking OOD images per set and method (default 8; 0: none)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    found = companion_files(args.results)
    written = write_report(args.results, args.out, methods=args.methods, scores=args.scores or found.get("scores"),
                           threshold_transfer=args.threshold_transfer or found.get("threshold_transfer"),
                           rule_selection=args.rule_selection or found.get("rule_selection"),
                           bootstrap=args.bootstrap, seed=args.seed, top_k=args.top_k, log=print)
    print(render_summary(args.results, args.methods))
    print(f"wrote {len(written)} files to {args.out}; open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="docs/report.md"))
