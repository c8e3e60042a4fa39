"""ShiftedBronzes' container set from ImageNet-21K folders (paper, Section 3.2), deterministically.

The paper had an LLM pick 94 container-related categories of ImageNet-21K (76,399 images), removed the ImageNet-1K
categories (83 left) and the images where the container is a secondary instance (51,023 left). Here:

1. categories: the wnid folders of `ROOT` (`ROOT/n03147509/*.jpg`) whose synset lies under one of `roots` by WordNet
   3.0 hyponymy (hyponyms and instance hyponyms), or exactly the `categories` given (wnids, senses such as
   `cup.n.01`, or nouns). The default roots, `DEFAULT_ROOTS` (vessel.n.03, dish.n.01, cup.n.01, glass.n.02,
   basket.n.01), span 224 synsets (30 of them ImageNet-1K's): jars, vases, bottles, pots, urns, bowls, cups, goblets,
   baskets. `container.n.01` itself would also take every wheeled vehicle (WordNet files a car under container);
2. ImageNet-1K's 1,000 categories removed (`imagenet1k_wnids.txt`, shipped beside this module; source in
   `imagenet1k_wnids.SOURCE.md`);
3. optionally, the secondary-instance filter: CLIP zero-shot, the main prompt ("a photo of a {}.") against each
   secondary one ("a photo of a person holding a {}.", "a photo of a baby with a {}.", ...): an image's share is the
   smallest two-way softmax share of the main prompt, min over s of sigmoid(scale * (cos(main) - cos(s))) at CLIP's
   logit scale, and an image whose share is below `threshold` is dropped (0.5: every secondary prompt must lose to
   the main one).

Output (`curate`): an OOD manifest (`ood_set: container`, `group: hard`, split test, images left in place; rows keep
`category`, `wnid`, `synset`), `categories.csv` (per category: images found, dropped, kept), `categories.png` (kept
images per category, the paper's Figure 2(b)), `dropped.csv` (every dropped image with its scores) and
`curation.json` (the roots or categories and what they resolved to, the ImageNet-1K categories removed, the filter's
model, prompts and threshold). Scores are cached per category (`.scores/<wnid>.json`, keyed by the model, the prompts
and the category's files): a rerun after a kill scores only what is missing.

The tree comes from strangers: wnid folders and their images are walked by `pipelines.walk` (no symlink followed, so
a "jpg" linked to /etc/passwd is never listed; FIFOs and devices never opened; what was left out is counted in
`curation.json`, `skipped`), and without the filter every image is decoded once all the same (`.probe/<wnid>.json`,
keyed by the category's files and their sizes and times): a 0-byte or text file named .jpg is dropped as unreadable
and listed in `dropped.csv`, never put into the manifest. One curation writes `out` at a time.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.curation.wordnet import Nouns
from pipelines.data import IMAGE_SUFFIXES, ImageLoadError, load_image, make_row
from pipelines.errors import ConfigError, UserInputError
from pipelines.fingerprint import file_identity
from pipelines.hub_ids import CLIP_ID
from pipelines.importers import decode_failures, write_external_manifest
from pipelines.io import atomic_path, atomic_write_json, atomic_write_text
from pipelines.locks import folder_lock
from pipelines.params import REQUIRED, Config, config, param
from pipelines.sources import GroupName
from pipelines.walk import Skipped, subfolders, walk_files

IMAGENET1K_FILE = Path(__file__).with_name("imagenet1k_wnids.txt")
DEFAULT_ROOTS: tuple[str, ...] = ("vessel.n.03", "dish.n.01", "cup.n.01", "glass.n.02", "basket.n.01")
MAIN_PROMPT = "a photo of a {}."
SECONDARY_PROMPTS: tuple[str, ...] = ("a photo of a person holding a {}.", "a photo of a baby with a {}.",
                                      "a photo of people with a {}.", "a photo of a {} in the background.")
_WNID = re.compile(r"n\d{8}")


def _prompt(value: str, key: str) -> None:
    if value.count("{}") != 1:
        raise ConfigError(f"{key}: a prompt holds the category as one '{{}}', got {value!r}")


def _prompts(values: list[str], key: str) -> None:
    if not values:
        raise ConfigError(f"{key}: at least one secondary prompt")
    for i, value in enumerate(values):
        _prompt(value, f"{key}[{i}]")


@config
class SecondaryFilter(Config):
    """CLIP zero-shot: drop an image whose main prompt does not beat each secondary prompt by a two-way share of at
    least `threshold`."""

    DOC = "README.md, section 'Your own data'"

    model: str = param(CLIP_ID, "CLIP model (hub id or folder)")
    main: str = param(MAIN_PROMPT, "the prompt of the container as the main object", check=_prompt)
    secondary: list[str] = param(list(SECONDARY_PROMPTS), "prompts of the container as a secondary instance",
                                 check=_prompts)
    threshold: float = param(0.5, "least two-way softmax share of the main prompt against each secondary one",
                             gt=0, lt=1)
    batch_size: int = param(64, "images per CLIP batch", ge=1, runtime=True)


@config
class ContainerCuration(Config):
    """Which ImageNet-21K categories make the container set, and how its rows are labelled."""

    DOC = "README.md, section 'Your own data'"

    imagenet21k: str = param(REQUIRED, "the ImageNet-21K folder: one folder per wnid (n03147509/...)")
    roots: list[str] = param(list(DEFAULT_ROOTS), "WordNet synsets whose hyponyms are chosen (wnids, senses, nouns)")
    categories: list[str] | None = param(None, "exactly these categories instead of `roots` (wnids, senses, nouns)")
    keep_imagenet1k: bool = param(False, "keep ImageNet-1K's categories (the paper removes them)")
    ood_set: str = param("container", "ood_set of every row")
    group: GroupName = param("hard", "OOD group of every row")
    wordnet_dir: str | None = param(None, "WordNet 3.0 database folder (None: the system's)")
    filter: SecondaryFilter | None = param(None, "the secondary-instance filter (None: keep every image)")


@dataclass
class Category:
    """One chosen category: its wnid, nltk-style synset name, label (first lemma) and image files (relative)."""

    wnid: str
    synset: str
    label: str
    files: list[str]


def imagenet1k_wnids() -> frozenset[str]:
    """The 1,000 wnids of ImageNet-1K (ILSVRC-2012), from the shipped list."""
    return frozenset(IMAGENET1K_FILE.read_text(encoding="utf-8").split())


def tree_wnids(root: Path, skipped: Skipped | None = None) -> list[str]:
    """The wnid folders of an ImageNet-21K folder, sorted (real folders: a symlinked one goes to `skipped`)."""
    if not root.is_dir():
        raise UserInputError(f"ImageNet-21K folder not found: {root}")
    wnids = sorted(p.name for p in subfolders(root, skipped if skipped is not None else Skipped())
                   if _WNID.fullmatch(p.name))
    if not wnids:
        raise UserInputError(f"{root}: no wnid folders (expected {root}/n03147509/*.jpg, ...)")
    return wnids


def _resolve(nouns: Nouns, names: Sequence[str], key: str) -> dict[str, list[str]]:
    out = {}
    for i, name in enumerate(names):
        try:
            out[name] = nouns.resolve(name)
        except ValueError as err:
            raise UserInputError(f"{key}[{i}]: {err}") from None
    return out


def choose_categories(cfg: ContainerCuration, nouns: Nouns, present: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """(the chosen wnids present in the tree, sorted; the record of the choice for `curation.json`)."""
    if cfg.categories is not None:
        resolved = _resolve(nouns, cfg.categories, "categories")
        wanted = {w for ws in resolved.values() for w in ws}
        record: dict[str, Any] = {"categories": resolved}
    else:
        resolved = _resolve(nouns, cfg.roots, "roots")
        wanted = nouns.hyponyms(w for ws in resolved.values() for w in ws)
        record = {"roots": resolved, "synsets_under_roots": len(wanted)}
    found = sorted(wanted.intersection(present))
    removed = [] if cfg.keep_imagenet1k else sorted(set(found) & imagenet1k_wnids())
    chosen = [w for w in found if w not in set(removed)]
    record.update({"in_tree": len(found), "imagenet1k_removed": removed, "chosen": len(chosen)})
    if cfg.categories is not None:
        record["not_in_tree"] = sorted(wanted.difference(present))
    if not chosen:
        raise UserInputError(f"{cfg.imagenet21k}: none of its {len(present)} wnid folders is a chosen category "
                             f"({len(found)} found, {len(removed)} of them ImageNet-1K categories)")
    return chosen, record


def main_share(logits: Sequence[float]) -> tuple[float, int]:
    """(the main prompt's smallest two-way softmax share against a secondary prompt, that prompt's index) of one
    image's zero-shot logits [main, secondary...] (logit scale x cosine)."""
    values = np.asarray(logits, np.float64)
    shares = 1.0 / (1.0 + np.exp(values[1:] - values[0]))
    worst = int(np.argmin(shares))
    return float(shares[worst]), worst + 1


class ClipScorer:
    """What the filter needs of a CLIP model: normalised image and text embeddings and the logit scale (the scripts
    pass `detectors.clip.backbone.ClipBackbone`'s, so the project has one CLIP code path)."""

    def __init__(self, encode_images: Callable[[list[Any]], np.ndarray],
                 encode_texts: Callable[[list[str]], np.ndarray], logit_scale: float, model_id: str):
        self.encode_images, self.encode_texts = encode_images, encode_texts
        self.logit_scale, self.model_id = logit_scale, model_id


def _score_key(flt: SecondaryFilter, scorer: ClipScorer, category: Category) -> str:
    text = json.dumps([scorer.model_id, flt.main, flt.secondary, category.label, category.files])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def score_category(root: Path, category: Category, flt: SecondaryFilter, scorer: ClipScorer,
                   cache: Path) -> dict[str, Any]:
    """{"key", "prompts", "logits": {file: [logit scale x cosine of each prompt, main first]}, "failures": {file:
    reason}}, cached in `cache/<wnid>.json` (the threshold is applied afterwards: changing it rescores nothing)."""
    key = _score_key(flt, scorer, category)
    path = cache / f"{category.wnid}.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved
    prompts = [p.format(category.label) for p in [flt.main, *flt.secondary]]
    texts = scorer.encode_texts(prompts)
    logits: dict[str, list[float]] = {}
    failures: dict[str, str] = {}
    for start in range(0, len(category.files), flt.batch_size):
        batch, images = [], []
        for name in category.files[start:start + flt.batch_size]:
            try:
                images.append(load_image(root / name))
                batch.append(name)
            except ImageLoadError as err:
                failures[name] = err.reason
        if not images:
            continue
        values = (scorer.logit_scale * np.asarray(scorer.encode_images(images), np.float64)
                  @ np.asarray(texts, np.float64).T)
        logits.update({name: [float(v) for v in row] for name, row in zip(batch, values)})
    result = {"key": key, "prompts": prompts, "logits": logits, "failures": failures}
    atomic_write_json(path, result)
    return result


def probe_category(root: Path, category: Category, cache: Path) -> dict[str, str]:
    """{file: reason} of the category's images that do not decode, cached in `cache/<wnid>.json` (keyed by the files
    and their sizes and modification times)."""
    identities = [file_identity(root / name, "stat") for name in category.files]
    key = hashlib.sha256(json.dumps([category.files, identities]).encode()).hexdigest()[:16]
    path = cache / f"{category.wnid}.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["failures"]
    failures = decode_failures(root, category.files)
    atomic_write_json(path, {"key": key, "failures": failures})
    return failures


def plot_counts(counts: dict[str, int], path: Path, title: str) -> None:
    """Images per category, largest first, as a bar chart (the paper's Figure 2(b))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.18 * len(items) + 2), 4))
    ax.bar(range(len(items)), [v for _, v in items], color="#4c72b0")
    ax.set_xticks(range(len(items)), [k for k, _ in items], rotation=90, fontsize=7)
    ax.set(ylabel="images", title=title, xlim=(-0.6, len(items) - 0.4))
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def curate(cfg: ContainerCuration, out: str | Path, scorer: ClipScorer | None = None) -> dict[str, Any]:
    """The container manifest and its records under `out` (module docstring); returns `curation.json`'s content."""
    if cfg.filter is not None and scorer is None:
        raise ValueError("curate: the secondary-instance filter needs a ClipScorer")
    with folder_lock(out, "curate_containers"):
        return _curate(cfg, Path(out), scorer)


def _category_files(root: Path, wnid: str, skipped: Skipped) -> list[str]:
    images, left_out = walk_files(root / wnid, IMAGE_SUFFIXES, relative_to=root)
    skipped.add(left_out)
    return [p.relative_to(root).as_posix() for p in images]


def _curate(cfg: ContainerCuration, out: Path, scorer: ClipScorer | None) -> dict[str, Any]:
    root = Path(cfg.imagenet21k)
    nouns = Nouns.load(cfg.wordnet_dir)
    skipped = Skipped()
    chosen, record = choose_categories(cfg, nouns, tree_wnids(root, skipped))
    categories = [Category(w, nouns.name(w), nouns.label(w), _category_files(root, w, skipped)) for w in chosen]
    rows, table, dropped = [], [], []
    for category in categories:
        kept = category.files
        if cfg.filter is None:
            failures = probe_category(root, category, out / ".probe")
            kept = [name for name in category.files if name not in failures]
            dropped += [[name, category.wnid, category.label, "", "", f"unreadable: {failures[name]}"]
                        for name in category.files if name in failures]
        else:
            scored = score_category(root, category, cfg.filter, scorer, out / ".scores")
            kept = []
            for name in category.files:
                if name in scored["failures"]:
                    dropped.append([name, category.wnid, category.label, "", "",
                                    f"unreadable: {scored['failures'][name]}"])
                    continue
                share, worst = main_share(scored["logits"][name])
                if share >= cfg.filter.threshold:
                    kept.append(name)
                else:
                    dropped.append([name, category.wnid, category.label, f"{share:.4f}", scored["prompts"][worst],
                                    "secondary instance"])
        rows += [make_row(f, split="test", role="ood", ood_set=cfg.ood_set, group=cfg.group, category=category.label,
                          wnid=category.wnid, synset=category.synset) for f in kept]
        table.append([category.wnid, category.synset, category.label, len(category.files),
                      len(category.files) - len(kept), len(kept)])
    out.mkdir(parents=True, exist_ok=True)
    _csv(out / "categories.csv", ["wnid", "synset", "category", "images", "dropped", "kept"], table)
    _csv(out / "dropped.csv", ["file_name", "wnid", "category", "main_share", "strongest_secondary_prompt", "reason"],
         dropped)
    record.update({"imagenet21k": str(root.resolve()), "images_found": sum(r[3] for r in table),
                   "images_dropped": len(dropped), "images_kept": len(rows), "skipped": skipped.summary(),
                   "filter": None if cfg.filter is None else {**cfg.filter.to_dict(), "model": scorer.model_id},
                   "config": cfg.to_dict()})
    atomic_write_json(out / "curation.json", record)
    if not rows:
        raise UserInputError(f"{root}: no image left in the {len(categories)} chosen categories (every drop is in "
                             f"{out / 'dropped.csv'})")
    write_external_manifest(out, rows, root)
    plot_counts({f"{r[2]} ({r[0]})": r[5] for r in table}, out / "categories.png",
                f"{cfg.ood_set}: {len(rows)} images in {len(table)} categories")
    return record
