"""ShiftedBronzes' container curation on an ImageNet-21K-shaped folder tree made here: the categories are exactly the
WordNet hyponyms of the roots (oracle: nltk's own WordNet reader on the same database files) minus ImageNet-1K's list;
the CLIP secondary-instance filter against transformers' own CLIP features in float64."""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import shutil
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.cli import run_main
from pipelines.curation.containers import (
    DEFAULT_ROOTS,
    IMAGENET1K_FILE,
    ContainerCuration,
    SecondaryFilter,
    choose_categories,
    imagenet1k_wnids,
)
from pipelines.curation.wordnet import LEXNAMES, Nouns
from pipelines.data import read_manifest

pytestmark = pytest.mark.slow  # its module fixture alone takes seconds (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[3]
WORDNET = Path("/usr/share/wordnet")
needs_wordnet = pytest.mark.skipif(not (WORDNET / "data.noun").is_file(),
                                   reason="WordNet 3.0 is not installed (apt-get install wordnet-base)")

# container-like categories outside ImageNet-1K, ImageNet-1K containers (vase, teapot, pitcher, bucket), and others
# (dog.n.01; tench, an ImageNet-1K animal; car.n.01, under container.n.01 but not under the default roots)
NEW_CONTAINERS = {"n03147509": 3, "n02880940": 2, "n03593526": 2, "n04592099": 1, "n02705429": 2, "n04516116": 1}
IMAGENET1K_CONTAINERS = {"n04522168": 2, "n04398044": 1, "n03950228": 1, "n02909870": 1}
OTHERS = {"n02084071": 2, "n01440764": 1, "n02958343": 1}


def _script():
    module = importlib.import_module("oodforge.commands.curate_containers")
    return module


def imagenet21k_tree(root: Path) -> Path:
    """wnid folders of small JPEG/PNG images, a non-wnid folder and a hidden file (both ignored)."""
    rng = np.random.default_rng(0)
    for wnid, n in {**NEW_CONTAINERS, **IMAGENET1K_CONTAINERS, **OTHERS}.items():
        (root / wnid).mkdir(parents=True)
        for i in range(n):
            pixels = rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / wnid / (f"{wnid}_{i}.JPEG" if i % 2 == 0 else f"{wnid}_{i}.png"))
    (root / "notes").mkdir()
    Image.new("RGB", (8, 8)).save(root / "notes" / "x.png")
    Image.new("RGB", (8, 8)).save(root / "n03147509" / ".hidden.png")
    return root


@pytest.fixture(scope="module")
def nltk_wordnet(tmp_path_factory):
    """nltk's WordNetCorpusReader on a copy of the same WordNet 3.0 files (nltk wants a `lexnames` file, which
    Debian's package lacks, and refuses symlinks out of its root)."""
    nltk = pytest.importorskip("nltk")
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    if not (WORDNET / "data.noun").is_file():
        pytest.skip("WordNet 3.0 is not installed (apt-get install wordnet-base)")
    folder = tmp_path_factory.mktemp("nltk_wordnet")
    for path in WORDNET.glob("*.*"):
        if path.is_file():
            shutil.copy(path, folder / path.name)
    kinds = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}
    (folder / "lexnames").write_text("".join(f"{i:02d}\t{n}\t{kinds[n.split('.')[0]]}\n" for i,
                                             n in enumerate(LEXNAMES)))
    nltk.data.path.insert(0, str(folder))

    class Reader(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):  # the database is WordNet 3.0 itself: nothing to map
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Reader(str(folder), None)


def oracle_categories(wn, roots, present) -> set[str]:
    below = set()
    for name in roots:
        top = wn.synset(name)
        below |= {top, *top.closure(lambda s: s.hyponyms() + s.instance_hyponyms())}
    return {f"n{s.offset():08d}" for s in below} & set(present) - imagenet1k_wnids()


def test_imagenet1k_list_is_the_shipped_timm_file_of_1000_noun_synsets():
    wnids = IMAGENET1K_FILE.read_text().split()
    assert len(wnids) == len(set(wnids)) == 1000 and wnids[0] == "n01440764" and wnids[-1] == "n15075141"
    source = (IMAGENET1K_FILE.parent / "imagenet1k_wnids.SOURCE.md").read_text()
    assert hashlib.sha256(IMAGENET1K_FILE.read_bytes()).hexdigest() in source and "timm" in source
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    assert any(IMAGENET1K_FILE.match(g) for g in globs)  # shipped in the wheel as package data


@needs_wordnet
def test_reader_agrees_with_nltk_on_names_hyponyms_and_senses(nltk_wordnet):
    nouns = Nouns.load()
    for name in ("vessel.n.03", "cup.n.01", "glass.n.02", "container.n.01", "bowl.n.03"):
        synset = nltk_wordnet.synset(name)
        wnid = f"n{synset.offset():08d}"
        assert nouns.resolve(name) == [wnid] and nouns.name(wnid) == name
        want = {f"n{s.offset():08d}" for s in [synset, *synset.closure(lambda s: s.hyponyms() + s.instance_hyponyms())]}
        assert nouns.hyponyms([wnid]) == want
    assert nouns.resolve("glass") == [f"n{s.offset():08d}" for s in nltk_wordnet.synsets("glass", "n")]
    assert nouns.label("n04592099") == "wineglass"
    for bad in ("cup.n.99", "n99999999", "not a noun at all"):
        with pytest.raises(ValueError, match="cup|n99999999|not a noun"):
            nouns.resolve(bad)


@needs_wordnet
def test_tree_gives_exactly_the_hyponyms_minus_imagenet1k(tmp_path, nltk_wordnet, capsys):
    tree = imagenet21k_tree(tmp_path / "in21k")
    out = tmp_path / "containers"
    cli = _script()
    assert run_main(cli.main, ["--imagenet21k", str(tree), "--out", str(out)]) == 0
    present = [p.name for p in tree.iterdir() if p.name.startswith("n")]
    want = oracle_categories(nltk_wordnet, DEFAULT_ROOTS, present)
    assert want == set(NEW_CONTAINERS)  # the test's own design, checked by the oracle
    manifest = read_manifest(out, check_files=True)
    assert {r["wnid"] for r in manifest} == want
    assert len(manifest) == sum(NEW_CONTAINERS.values())  # every image kept, the hidden one never listed
    assert {(r["role"], r["ood_set"], r["group"], r["split"], r["label"])
            for r in manifest} == {("ood", "container", "hard", "test", -1)}
    assert manifest.root == tree.resolve()
    cup = [r for r in manifest if r["wnid"] == "n03147509"]
    assert {(r["category"], r["synset"]) for r in cup} == {("cup", "cup.n.01")} and len(cup) == 3
    with open(out / "categories.csv") as f:
        counts = {row["wnid"]: int(row["kept"]) for row in csv.DictReader(f)}
    assert counts == NEW_CONTAINERS
    record = json.loads((out / "curation.json").read_text())
    assert set(record["imagenet1k_removed"]) == set(IMAGENET1K_CONTAINERS) and record["filter"] is None
    assert record["roots"]["vessel.n.03"] == ["n04531098"]
    assert Image.open(out / "categories.png").size[0] > 100
    assert "11 images in 6 categories" in capsys.readouterr().out

    # the root synsets given by the user; container.n.01 also takes car.n.01 (a wheeled vehicle is a container)
    assert run_main(cli.main, ["--imagenet21k", str(tree), "--out", str(tmp_path / "c2"), "--roots", "container.n.01",
                               "--keep-imagenet1k"]) == 0
    got = {r["wnid"] for r in read_manifest(tmp_path / "c2")}
    assert got == oracle_categories(nltk_wordnet, ["container.n.01"], present) | set(IMAGENET1K_CONTAINERS)
    assert "n02958343" in got and "n02084071" not in got
    capsys.readouterr()

    # a given list of categories: wnids, senses and nouns; an ImageNet-1K one is still removed
    assert run_main(cli.main, ["--imagenet21k", str(tree), "--out", str(tmp_path / "c3"), "--dry-run",
                               "--categories", "n03147509,jar.n.01,wineglass,vase"]) == 0
    assert capsys.readouterr().out.startswith("3 categories (4 in the tree, 1 ImageNet-1K ones removed): n03147509 "
                                              "n03593526 n04592099")
    assert not (tmp_path / "c3").exists()


@needs_wordnet
def test_bad_inputs_are_one_line(tmp_path, capsys):
    tree = imagenet21k_tree(tmp_path / "in21k")
    cli = _script()
    cases = [(["--categories", "cup.n.99"], "error: categories[0]: 'cup.n.99': the noun 'cup' has"),
             (["--roots", "tench.n.01"], "none of its 13 wnid folders is a chosen category"),
             (["--filter", "--threshold", "1.5"], "error: --threshold: must be > 0 and < 1"),
             (["--filter", "--main", "a photo"], "--main: a prompt holds the category as one"),
             (["--imagenet21k", str(tmp_path / "nope")], "ImageNet-21K folder not found")]
    for extra, message in cases:
        argv = ["--imagenet21k", str(tree), "--out", str(tmp_path / "o"), *extra]
        assert run_main(cli.main, argv) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with pytest.raises(Exception, match="secondary prompt"):
        SecondaryFilter.from_dict({"secondary": []})


def _hf_main_share(model_dir: Path, images: list[Image.Image], prompts: list[str]) -> np.ndarray:
    """The main prompt's smallest two-way softmax share against each other prompt, from transformers' own CLIP
    feature functions in float64 (torch.softmax over each [main, secondary] pair)."""
    import torch
    from transformers import CLIPModel, CLIPProcessor

    model, processor = CLIPModel.from_pretrained(model_dir).eval(), CLIPProcessor.from_pretrained(model_dir)
    with torch.no_grad():
        image = model.get_image_features(**processor(images=images, return_tensors="pt")).pooler_output.double()
        text = (model.get_text_features(**processor.tokenizer(prompts, padding=True, return_tensors="pt"))
                .pooler_output.double())
        scale = float(model.logit_scale.exp())
    image, text = image / image.norm(dim=-1, keepdim=True), text / text.norm(dim=-1, keepdim=True)
    logits = scale * image @ text.T
    pairs = [torch.softmax(logits[:, [0, s]], dim=-1)[:, 0] for s in range(1, len(prompts))]
    return torch.stack(pairs, dim=1).min(dim=1).values.numpy()


@needs_wordnet
def test_secondary_instance_filter_records_threshold_prompts_and_every_dropped_image(tmp_path, single_torch_thread):
    from pipelines.tiny import save_tiny_clip

    tree = imagenet21k_tree(tmp_path / "in21k")
    clip = save_tiny_clip(tmp_path / "clip")
    out = tmp_path / "containers"
    argv = ["--imagenet21k", str(tree), "--out", str(out), "--filter", "--clip", str(clip), "--batch-size", "2"]
    assert run_main(_script().main, argv) == 0
    flt = SecondaryFilter()
    expected_drop, expected_keep = set(), set()
    nouns = Nouns.load()
    for wnid in NEW_CONTAINERS:
        files = sorted(p for p in (tree / wnid).iterdir() if not p.name.startswith("."))
        prompts = [t.format(nouns.label(wnid)) for t in [flt.main, *flt.secondary]]
        shares = _hf_main_share(clip, [Image.open(p).convert("RGB") for p in files], prompts)
        for path, share in zip(files, shares):
            assert abs(share - 0.5) > 1e-4  # no case decided by float noise
            (expected_keep if share >= 0.5 else expected_drop).add(f"{wnid}/{path.name}")
    assert expected_drop and expected_keep  # the threshold splits this tree
    assert {r["file_name"] for r in read_manifest(out)} == expected_keep
    with open(out / "dropped.csv") as f:
        dropped = list(csv.DictReader(f))
    assert {d["file_name"] for d in dropped} == expected_drop
    assert all(d["reason"] == "secondary instance" and float(d["main_share"]) < 0.5 for d in dropped)
    assert all(d["strongest_secondary_prompt"].startswith("a photo of") for d in dropped)
    record = json.loads((out / "curation.json").read_text())
    assert record["filter"]["threshold"] == 0.5 and record["filter"]["secondary"] == list(flt.secondary)
    assert record["filter"]["main"] == "a photo of a {}." and record["filter"]["model"] == str(clip)
    assert record["images_dropped"] == len(expected_drop)
    with open(out / "categories.csv") as f:
        table = {r["wnid"]: (int(r["images"]), int(r["dropped"]), int(r["kept"])) for r in csv.DictReader(f)}
    assert sum(v[1] for v in table.values()) == len(expected_drop) and all(a == b + c for a, b, c in table.values())

    # a rerun, also with another threshold, reuses the cached scores; a changed prompt rescores
    cached = {p.name: p.stat().st_mtime_ns for p in (out / ".scores").iterdir()}
    assert run_main(_script().main, [*argv, "--threshold", "0.01"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / ".scores").iterdir()} == cached
    assert len(read_manifest(out)) == sum(NEW_CONTAINERS.values()) - sum(
        float(d["main_share"]) < 0.01 for d in dropped)
    # (a threshold of 1e-300 drops nothing: a two-way share is at least sigmoid(-2 * logit scale) > 1e-87, so the random
    # tiny CLIP's shares under the new prompt cannot empty the set, whatever the library version computes)
    assert run_main(_script().main,
                    [*argv, "--secondary", "a photo of a hand holding a {}.", "--threshold", "1e-300"]) == 0
    assert all(p.stat().st_mtime_ns != cached[p.name] for p in (out / ".scores").iterdir())
    assert json.loads((out / "curation.json").read_text())["filter"]["secondary"] == ["a photo of a hand holding a {}."]


@needs_wordnet
def test_choose_categories_without_imagenet1k_removal_keeps_them():
    nouns = Nouns.load()
    cfg = ContainerCuration.from_dict({"imagenet21k": "x", "keep_imagenet1k": True, "categories": ["vase", "cup.n.01"]})
    chosen, record = choose_categories(cfg, nouns, ["n04522168", "n03147509", "n01440764"])
    assert chosen == ["n03147509", "n04522168"] and record["imagenet1k_removed"] == []
    assert record["categories"]["vase"] == ["n04522168"]
