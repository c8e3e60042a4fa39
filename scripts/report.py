"""Render a results table into a report: `python scripts/report.py --results results.csv --out DIR`.

Writes per_set.{md,tex,csv}, table3.{md,tex,csv} (methods x OOD sets), table4.{md,tex,csv} (family x group means),
families.{md,csv}, fpr95_by_method.png, score_density_<method>.png (with per-sample scores), threshold_transfer.md (when
threshold_transfer.csv lies beside the results) and best_rule.{md,tex,csv} (when the results carry `base` / `rule`
columns), then prints a compact summary.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from detectors.report import companion_files, render_summary, write_report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", required=True, type=Path, help="results table (.csv or .parquet), one row per (method, ood_set)")
    parser.add_argument("--out", required=True, type=Path, help="output folder")
    parser.add_argument("--methods", type=lambda s: [m.strip() for m in s.split(",") if m.strip()], default=None,
                        help="comma-separated methods to report (default: all)")
    parser.add_argument("--scores", type=Path, default=None,
                        help="per-sample scores .parquet for density plots (default: scores.parquet beside --results, if any)")
    parser.add_argument("--threshold-transfer", type=Path, default=None,
                        help="threshold-transfer .csv (default: threshold_transfer.csv beside --results, if any)")
    parser.add_argument("--best-rule-on", default="local",
                        help="OOD set whose AUROC picks each training method's post-hoc rule (best_rule table; default local)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    found = companion_files(args.results)
    written = write_report(args.results, args.out, methods=args.methods, scores=args.scores or found.get("scores"),
                           threshold_transfer=args.threshold_transfer or found.get("threshold_transfer"),
                           best_rule_on=args.best_rule_on)
    print(render_summary(args.results, args.methods))
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
