"""The embedded default job (no download): `oodforge demo --out demo_out` (what `make demo` runs).

1. Writes scikit-learn's bundled digits as manifests: ID = digits 0-5; OOD = digits 6-9 (near), opencv edge sketches of
   ID digits (near), synthetic textures (far).
2. Trains a small transformers ResNet on the ID train split (CPU, seconds) and saves it like a hub model.
3. Runs every post-hoc detector through the real evaluation runner and writes the report.
4. Further stages (generation with tiny ZeST models, CLIP-prompt detectors on a tiny CLIP) run when their modules exist.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from oodforge.args import command_parser, load_config
from pipelines.cli import README_SECTIONS, comma_list
from pipelines.params import Config, config, param

DOC = README_SECTIONS["scripts"]
"""Where the command's inputs are documented (named in its one-line errors)."""

STAGES = ("generation", "clip")


@config
class DemoConfig(Config):
    """What `oodforge demo` runs; every key has its flag (`FLAGS`)."""

    DOC = DOC

    out: str = param("demo_out", "output folder")
    epochs: int = param(8, "classifier training epochs")
    seed: int = param(0, "seed of the data, training and detectors")
    skip: list[str] = param([], f"stages to skip: {', '.join(STAGES)}")


FLAGS = {"--" + name: name for name in DemoConfig.fields()}
"""The command's flags as shorthands of its config's keys, each the key (docs/cli.md)."""


def train_digit_classifier(id_dir: Path, folder: Path, epochs: int, seed: int) -> Path:
    """Fine-tune the tiny ResNet on the ID train split and save it with its processor (skipped when present)."""
    from transformers import ResNetForImageClassification

    from pipelines.classifier import ImageClassifier
    from pipelines.data import read_manifest
    from pipelines.toydata import tiny_digit_classifier_config
    from pipelines.training import finetune

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    config, processor = tiny_digit_classifier_config()
    folder.mkdir(parents=True, exist_ok=True)
    ResNetForImageClassification(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    classifier = ImageClassifier.from_pretrained(folder)
    manifest = read_manifest(id_dir)
    result = finetune(classifier, manifest.select(split="train", role="id"),
                      val=manifest.select(split="val", role="id"),
                      epochs=epochs, lr=3e-3, batch_size=32, warmup_epochs=1, seed=seed)
    classifier.save_pretrained(folder)
    print(f"classifier: {epochs} epochs, ID val accuracy {_last_accuracy(result):.3f}")
    return folder


def _last_accuracy(result) -> float:
    history = getattr(result, "history", None) or []
    for entry in reversed(history):
        for key, value in entry.items():
            if key.startswith("acc") or key == "val_accuracy":
                return float(value)
    return float("nan")


def build_parser():
    p = command_parser(__name__, __doc__, out=True)
    p.add_argument("--epochs", type=int, default=None, help="classifier training epochs (default 8)")
    p.add_argument("--seed", type=int, default=None, help="seed of the data, training and detectors (default 0)")
    p.add_argument("--skip", type=comma_list, default=None, help=f"comma-separated stages to skip: {','.join(STAGES)}")
    return p


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    cfg = load_config(DemoConfig, p.parse_args(argv), FLAGS)
    skip = set(cfg.skip)
    if skip - set(STAGES):
        p.error(f"--skip: unknown stage(s) {sorted(skip - set(STAGES))}; stages: {', '.join(STAGES)}")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from detectors.harness.evaluate import EvalConfig, Runner
    from detectors.harness.report import render_summary, write_report
    from pipelines.toydata import write_digits

    start = time.perf_counter()
    out = Path(cfg.out)
    id_dir, ood_dir = (out / "data" / "id", out / "data" / "ood")
    if not (id_dir / "metadata.jsonl").is_file() or not (ood_dir / "metadata.jsonl").is_file():
        id_dir, ood_dir = write_digits(out / "data", seed=cfg.seed)
    model_dir = train_digit_classifier(id_dir, out / "classifier", cfg.epochs, cfg.seed)
    config = EvalConfig.from_dict({"model": str(model_dir), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}],
                                   "out": str(out / "posthoc"), "detectors": "all", "families": ["posthoc"],
                                   "batch_size": 128})
    stage = time.perf_counter()
    results = Runner(config).run()
    written = write_report(results, out / "report", scores=out / "posthoc" / "scores.parquet")
    print(f"\nPost-hoc detectors on digits (ID = 0-5), {time.perf_counter() - stage:.0f} s; per OOD set:\n")
    print((out / "report" / "per_set.md").read_text())
    print(render_summary(results))
    extra = _optional_stages(out, id_dir, ood_dir, skip)
    print("\nFiles written:")
    for path in [out / "posthoc" / "results.csv", out / "posthoc" / "scores.parquet", *written, *extra]:
        print(f"  {path}")
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")


def _optional_stages(out: Path, id_dir: Path, ood_dir: Path, skip: set[str]) -> list[Path]:
    """Generation (tiny ZeST) and CLIP (tiny CLIP: MCM + LoCoOp) stages; returns the paths they wrote."""
    import pandas as pd

    from detectors.harness.report import render_summary
    from pipelines.data import load_image, read_manifest

    written: list[Path] = []
    if "generation" not in skip:
        from gen.demo import generation_demo

        stage = time.perf_counter()
        made = generation_demo(out / "generation")
        print(f"\nMaterial transfer (tiny random ZeST models, 64 px, 2 steps): {made['summary'].get('done', '?')} "
              "images, "
              f"{time.perf_counter() - stage:.0f} s")
        written += [Path(made["manifest"]), Path(made["contact_sheet"])]
    if "clip" not in skip:
        from detectors.harness.clip_demo import clip_demo

        stage = time.perf_counter()
        idm = read_manifest(id_dir).select(split="test", role="id")
        picked = [r for i, r in enumerate(idm.rows) if i % 10 == 0]
        oodm = read_manifest(ood_dir)
        ood = ({name: [load_image(oodm.path(r)) for r in oodm.select(ood_set=name).rows[:40]]
                for name in oodm.ood_sets()})
        names = [f"digit {c}" for c in sorted({r["label"] for r in picked})]
        rows = (clip_demo(str(out / "clip"), [load_image(idm.path(r)) for r in picked], [r["label"] for r in picked],
                          names, ood))
        frame = pd.DataFrame(rows)
        frame["group"] = frame["ood_set"].map({r["ood_set"]: r["group"] for r in oodm.rows})
        path = out / "clip" / "results.csv"
        frame.to_csv(path, index=False)
        print(f"\nCLIP-prompt detectors on a tiny random-weight CLIP (a wiring check, not a benchmark), "
              f"{time.perf_counter() - stage:.0f} s:\n")
        print(render_summary(frame))
        written += [path, out / "clip" / "locoop"]
    return written
