"""The report of a small generic run as a user meets it: no table repeats another's values, no note about data the run
does not have (hops, threshold transfer), ID-looking sheets with 28 px images scaled up, captioned with the true set
and the predicted class ("species" only where rows have one), a score axis on the density grid, and the page looked
at in headless Chromium (one screenshot)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from detectors.harness import report
from detectors.harness.report import plots
from detectors.harness.report.sections import family_columns, new_averages
from detectors.harness.report.tables import Layout
from detectors.metrics import evaluate
from pipelines.data import make_row, write_manifest

METHODS = {"msp": 1.5, "ebo": 1.0, "knn": 2.0}
CLASSES = ["shirt", "trouser", "bag"]


def _digit(path: Path, value: int) -> None:
    """A 28 x 28 grey image (Fashion-MNIST's size), a bar at row `value`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.zeros((28, 28), np.uint8)
    pixels[value % 28, :] = 255
    Image.fromarray(pixels).save(path)


def _run(root: Path) -> tuple[pd.DataFrame, Path]:
    """ID test rows and two OOD sets of one group each (no hop, no species), scored by three methods with the
    classifier's predicted class, and the results table computed from those scores."""
    id_rows = [make_row(f"id_{i}.png", split="test", role="id", label=i % 3) for i in range(30)]
    ood_rows = [make_row(f"{s}_{i}.png", split="test", role="ood", ood_set=s, group=g)
                for s, g in (("sketch", "near"), ("texture", "far")) for i in range(12)]
    for folder, rows in (("id", id_rows), ("ood", ood_rows)):
        for i, row in enumerate(rows):
            _digit(root / folder / row["file_name"], i)
        write_manifest(root / folder, rows)
    rng = np.random.default_rng(0)
    frames, results = [], []
    for method, shift in METHODS.items():
        id_scores = rng.normal(shift, 1, len(id_rows))
        frames.append(pd.DataFrame({"method": method, "family": "posthoc", "role": "id", "ood_set": "id", "group": "id",
                                    "index": range(len(id_rows)), "score": id_scores,
                                    "file_name": [r["file_name"] for r in id_rows], "manifest": str(root / "id"),
                                    "pred": [CLASSES[i % 3] for i in range(len(id_rows))]}))
        for s, g in (("sketch", "near"), ("texture", "far")):
            rows = [r for r in ood_rows if r["ood_set"] == s]
            ood = rng.normal(0, 1, len(rows))
            frames.append(pd.DataFrame({"method": method, "family": "posthoc", "role": "ood", "ood_set": s,
                                        "group": g, "index": range(len(rows)), "score": ood,
                                        "file_name": [r["file_name"] for r in rows], "manifest": str(root / "ood"),
                                        "pred": [CLASSES[(i + 1) % 3] for i in range(len(rows))]}))
            metrics = evaluate(id_scores, ood)
            results.append({"method": method, "family": "posthoc", "ood_set": s, "group": g, **metrics,
                            "n_id": len(id_rows), "n_ood": len(rows), "seconds": 0.1, "id_acc": 0.9})
    scores = root / "scores.parquet"
    pd.concat(frames, ignore_index=True).to_parquet(scores)
    return pd.DataFrame(results), scores


def test_the_page_repeats_no_value():
    """A group's average is shown only when it averages two sets or more and not every set; Table 4's groups only
    when there are two or more (with one, each equals `all`)."""
    one_each = Layout({"posthoc": ["m"]}, {"near": ["a"], "far": ["b"]})
    assert new_averages(one_each) == ["all avg"] and family_columns(one_each) == ["all", "near", "far", "average"]
    one_group = Layout({"posthoc": ["m"]}, {"near": ["a", "b"]})
    assert new_averages(one_group) == ["all avg"] and family_columns(one_group) == ["all"]
    mixed = Layout({"posthoc": ["m"]}, {"near": ["a", "b"], "far": ["c"]})
    assert new_averages(mixed) == ["near avg", "all avg"]
    assert new_averages(Layout({"posthoc": ["m"]}, {"near": ["a"]})) == []


def test_a_small_28px_sheet_is_scaled_up_and_captioned(tmp_path):
    _digit(tmp_path / "a.png", 3)
    pixels = plots.thumbnail(tmp_path / "a.png")
    assert pixels.shape[:2] == (112, 112)  # 28 px x 4, nearest neighbour: sharp squares
    assert set(np.unique(pixels)) <= {0, 255}
    rows = pd.DataFrame({"method": "msp", "rank": [1], "score": [0.5], "id_share": [40.0], "pred": ["bag"],
                         "species": [None], "file_name": ["a.png"], "path": [str(tmp_path / "a.png")]})
    sheet = plots.id_looking_sheet(rows, "sketch")
    assert sheet.captions == ["#1 0.5 (40%)\nsketch → bag\na.png"]
    assert "predicted class" in sheet.title and "species" not in sheet.title
    assert sheet.image.width <= 1336  # shown at its own size within the page (body max-width 1360 - padding)
    with_species = plots.id_looking_sheet(rows.assign(species=["Danaus plexippus"]), "sketch")
    assert "species" in with_species.title and "Danaus plexippus" in with_species.captions[0]


def _check_script():
    return importlib.import_module("scripts.check_report_html")


@pytest.mark.skipif(_check_script().find_chromium() is None,
                    reason="Chromium (Debian package `chromium`) not installed")
@pytest.mark.slow
def test_a_small_run_in_headless_chromium(tmp_path, capsys):
    results, scores = _run(tmp_path / "run")
    notes: list[str] = []
    report.write_report(results, tmp_path / "report", scores=scores, log=notes.append)
    page = (tmp_path / "report" / "index.html").read_text()
    assert not any("hop" in n or "threshold_transfer" in n for n in notes), notes
    assert re.findall(r"<h2[^>]*>(.*?)</h2>", page) == [
        "Table 3: methods x OOD sets", "Group averages", "Table 4: family x group", "Figures: FPR@95 by family",
        "ROC curves and score densities", "Most ID-looking OOD images"]
    assert page.count("<table") == 3 and "near avg" not in page  # one set a group: its average is its column
    assert "((log)" not in page and 'class="wide" src="id_looking_sketch.jpg"' in page
    check = _check_script()
    shot = tmp_path / "shot.png"
    assert check.main([str(tmp_path / "report" / "index.html"), "--screenshot", str(shot)]) == 0
    assert "0 broken" in capsys.readouterr().out
    with Image.open(tmp_path / "report" / "id_looking_sketch.jpg") as sheet, Image.open(shot) as page_shot:
        assert page_shot.width == 1400 and sheet.width <= 1336  # the sheet is drawn at its own size on the page
        assert page_shot.height > sheet.height
