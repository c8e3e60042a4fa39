"""Render a run into a report: `oodforge report --results RUN/results.csv --out RUN/report`.

Reads results.csv and, when they lie beside it, scores.parquet, threshold_transfer.csv, rule_selection.csv and
fewshot.csv. The generic layout writes Table 3 / per-set / family tables (md, tex, csv), the best rule per training
method, the threshold-transfer table, FPR@95 by family, heatmaps, ROC curves, score densities, bootstrap intervals
(`--bootstrap N`), AUROC per taxonomic hop, the field report per novel species, the most ID-looking OOD images and
index.html showing them all. `--layout shiftedbronzes` writes that paper's Tables 2-4 and Figures 5, 6, 7, 2(c);
`--layout open-insects` takes one `--results` per region and writes that paper's Tables 2/7, 4, 5, 6 and Figures 1,
3 and 4 (see docs/report.md). A paper layout draws only the paper's figures (`--diagnostics`: the generic ones too).
`--openset` adds the Open-Insect evaluator's open-set columns (its ood.csv: TNR@10 ... OOSA) per run.
Prints the summary and a warning per set with AUROC below 50.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from detectors.harness.report import LAYOUTS, companion_files, render_summary, write_open_insects, write_report
from detectors.harness.report.write import FIGURES
from oodforge.args import command_parser, load_config
from pipelines.cli import comma_list
from pipelines.errors import UserInputError
from pipelines.params import REQUIRED, Config, config, param

DOC = "docs/report.md"
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class ReportConfig(Config):
    """What `oodforge report` renders (docs/report.md); every key has its flag (`FLAGS`)."""

    DOC = DOC

    results: list[str] = param(REQUIRED, "results tables, one per region with the open-insects layout")
    out: str = param(REQUIRED, "output folder")
    layout: Literal[LAYOUTS] = param("generic", "tables and figures in a paper's shapes")  # type: ignore[valid-type]
    figures: Literal[tuple(FIGURES)] = param("png", "png, pdf (also a PDF of each figure) or none")  # type: ignore[misc]
    workers: int | None = param(None, "figure processes; null: the CPUs", runtime=True)
    methods: list[str] | None = param(None, "methods to report; null: all")
    scores: str | None = param(None, "per-sample scores .parquet; null: scores.parquet beside the results, if any")
    threshold_transfer: str | None = param(None, "threshold-transfer .csv; null: the one beside the results, if any")
    rule_selection: str | None = param(None, "the runner's rule choice; null: the one beside the results, if any")
    bootstrap: int = param(0, "bootstrap replicates for 95% intervals of AUROC and FPR@95 (0: none)")
    seed: int = param(0, "bootstrap seed")
    top_k: int = param(8, "most ID-looking OOD images per set and method (0: none)")
    classifier: list[str] | None = param(None, "shiftedbronzes: the dating classifiers' folders for Table 2")
    diagnostics: bool = param(False, "also the heatmaps; in a paper layout also the generic figures and tables")
    fewshot: str | None = param(None, "shiftedbronzes: few-shot table for Figure 7; null: fewshot.csv beside results")
    feature_maps: str | None = param(None, "shiftedbronzes: folder of feature-map outputs for Figure 2(c)")
    splits: str | None = param(None, "open-insects: the species splits folder for Table 5")
    pretrained: list[str] = param([], "open-insects: the runs whose classifier started from ImageNet-1K weights")
    aux_study: str | None = param(None, "open-insects: oodforge aux-study's folder for Figure 4")
    openset: bool = param(False, "also the Open-Insect evaluator's open-set columns per run")


FLAGS = {"--" + name.replace("_", "-"): name for name in ReportConfig.fields()}
"""The command's flags as shorthands of its config's keys, each the key with dashes (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__)
    p.add_argument("--results", nargs="+", metavar="[REGION=]PATH",
                   help="results table (.csv or .parquet), one row per (method, ood_set); with --layout open-insects "
                        "one per region (REGION=PATH, or PATH named by its run folder)")
    p.add_argument("--out", type=Path, help="output folder")
    p.add_argument("--layout", default=None, choices=LAYOUTS, help="tables and figures in a paper's shapes "
                   "(default generic)")
    p.add_argument("--figures", default=None, choices=list(FIGURES),
                   help="png (default), pdf (also a publication PDF of each figure) or none")
    p.add_argument("--workers", type=int, default=None, help="figure processes (default: the CPUs)")
    p.add_argument("--methods", type=comma_list, default=None, help="comma-separated methods to report (default: all)")
    p.add_argument("--scores", type=Path, default=None,
                   help="per-sample scores .parquet (default: scores.parquet beside --results, if any)")
    p.add_argument("--threshold-transfer", type=Path, default=None,
                   help="threshold-transfer .csv (default: threshold_transfer.csv beside --results, if any)")
    p.add_argument("--rule-selection", type=Path, default=None,
                   help="the runner's rule choice on validation (default: rule_selection.csv beside --results, if any)")
    p.add_argument("--bootstrap", type=int, default=None, metavar="N",
                   help="bootstrap replicates for 95%% intervals of AUROC and FPR@95 (default 0: none)")
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed (default 0)")
    p.add_argument("--top-k", type=int, default=None,
                   help="most ID-looking OOD images per set and method (default 8; 0: none)")
    p.add_argument("--classifier", nargs="+", default=None, metavar="[NAME=]PATH",
                   help="shiftedbronzes: the dating classifiers' folders (or their metrics.json) for Table 2, one row "
                        "each (NAME=PATH, or PATH named by its folder)")
    p.add_argument("--diagnostics", action="store_true", default=None,
                   help="also the heatmaps (a coloured Table 3); in a paper layout also the generic figures and score "
                        "tables (ROC curves, score densities, ID-looking images, AUROC by hop, field report)")
    p.add_argument("--fewshot", type=Path, default=None,
                   help="shiftedbronzes: few-shot table for Figure 7 (default: fewshot.csv beside --results, if any)")
    p.add_argument("--feature-maps", type=Path, default=None,
                   help="shiftedbronzes: folder of oodforge feature-map outputs (feature_map_*.csv) for Figure 2(c)")
    p.add_argument("--splits", type=Path, default=None,
                   help="open-insects: the species splits folder (summary.json or summary.csv, region manifests) for "
                        "Table 5")
    p.add_argument("--pretrained", type=comma_list, default=None, metavar="REGION[,REGION]",
                   help="open-insects: the runs whose classifier started from ImageNet-1K weights (Table 7; the others "
                        "are trained from scratch, Table 2)")
    p.add_argument("--aux-study", type=Path, default=None,
                   help="open-insects: oodforge aux-study's folder (aux_study.csv) for Figure 4")
    p.add_argument("--openset", action="store_true", default=None,
                   help="also the Open-Insect evaluator's open-set columns (TNR@10 ... OOSA, its ood.csv order) per "
                        "run: openset.{md,csv}; the papers' tables stay as printed")
    return p


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(ReportConfig, build_parser().parse_args(argv), FLAGS)
    out = Path(cfg.out)
    if cfg.layout == "open-insects":
        written = write_open_insects(cfg.results, out, splits=cfg.splits, figures=cfg.figures, log=print,
                                     workers=cfg.workers, pretrained=cfg.pretrained, aux_study=cfg.aux_study,
                                     openset=cfg.openset)
        print(f"wrote {len(written)} files to {out}; open {out / 'index.html'}")
        return 0
    if len(cfg.results) > 1:
        raise UserInputError(f"--results: one table for --layout {cfg.layout} (several only with open-insects)")
    results = Path(cfg.results[0])
    found = companion_files(results)
    written = write_report(results, out, methods=cfg.methods, scores=cfg.scores or found.get("scores"),
                           threshold_transfer=cfg.threshold_transfer or found.get("threshold_transfer"),
                           rule_selection=cfg.rule_selection or found.get("rule_selection"),
                           bootstrap=cfg.bootstrap, seed=cfg.seed, top_k=cfg.top_k, log=print, layout=cfg.layout,
                           figures=cfg.figures, classifier=cfg.classifier,
                           fewshot=cfg.fewshot or found.get("fewshot"),
                           feature_maps=cfg.feature_maps, workers=cfg.workers,
                           diagnostics=cfg.diagnostics, openset=cfg.openset)
    print(render_summary(results, cfg.methods))
    print(f"wrote {len(written)} files to {out}; open {out / 'index.html'}")
    return 0
