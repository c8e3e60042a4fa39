"""index.html opens on the result: the paper's first table at the top (Chromium: its first row on the first 1400 x 900
screen, the page no wider than the window), the metric conventions stated once, warnings as one line of counts per kind
with the details collapsed at the end and in warnings.md (display names; only rows that appear in a table), config
labels printed as given after the paper's methods, Table 7 for the ImageNet-pretrained runs and Figure 4 from the
auxiliary-diversity study."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import tests.detectors.harness.report.test_report_layouts as layouts
from detectors.harness.report import CONVENTIONS, write_open_insects, write_report
from detectors.harness.report.names import SHIFTED_BRONZES
from tests.detectors.harness.report.report_checks import assert_usable_png

ROOT = Path(__file__).resolve().parents[4]
SETS = {"sketch_rubbing": "hard", "transferred_bronze": "hard", "transferred_container": "hard", "container": "hard",
        "species": "easy", "imagenet_o": "easy", "inaturalist": "easy", "texture": "easy", "openimage_o": "easy"}
FAMILIES = {"clip": ("idlike", "clipn", "locoop"), "generative": ("opengan", "diffguard")}


def _check_script():
    return importlib.import_module("scripts.check_report_html")


def _paper_results() -> pd.DataFrame:
    """The paper's 18 methods in the config's order (not the paper's) and one config label, on its nine sets."""
    rng = np.random.default_rng(0)
    methods = [("openmax", "posthoc"), ("msp", "posthoc"), ("odin", "posthoc"), ("mds", "posthoc"),
               ("gram", "posthoc"), ("ebo", "posthoc"), ("gradnorm", "posthoc"), ("react", "posthoc"),
               ("mls", "posthoc"), ("klm", "posthoc"), ("vim", "posthoc"), ("knn", "posthoc"), ("dice", "posthoc"),
               ("MyDetector", "posthoc"), *((m, f) for f, ms in FAMILIES.items() for m in ms)]
    rows = [{"method": m, "family": f, "ood_set": s, "group": g, "auroc": rng.uniform(0.55, 0.99),
             "fpr95": rng.uniform(0.05, 0.99), "aupr_in": 0.5, "aupr_out": 0.5, "n_id": 10, "n_ood": 10, "seconds": 1.0}
            for m, f in methods for s, g in SETS.items()]
    frame = pd.DataFrame(rows)
    frame.loc[(frame["method"] == "opengan") & (frame["ood_set"].isin(["container", "species"])), "auroc"] = 0.31
    return frame


@pytest.fixture(scope="module")
def bronze_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "report"
    lines = []
    write_report(_paper_results(), out, layout="shiftedbronzes", figures="none", log=lines.append)
    return out, lines


def test_paper_order_names_and_an_explicit_label(bronze_page):
    out, lines = bronze_page
    table = pd.read_csv(out / "sb_table3.csv")
    expected = [m for m in SHIFTED_BRONZES.order if m in set(table["method"])]
    assert list(table["method"]) == expected[:13] + ["MyDetector"] + expected[13:]  # a label after the paper's
    md = (out / "sb_table3.md").read_text()
    assert "| Gram |" in md and "| KL-Matching |" in md and "| MyDetector |" in md and "GRAM" not in md
    assert "ID acc." not in md and "sketch_rubbing" not in md and "Sketch & Rubbing (Hard)" in md
    assert any("config labels" in line and "MyDetector" in line for line in lines)


def test_page_head_conventions_once_and_warnings_collapsed(bronze_page):
    out, _ = bronze_page
    page = (out / "index.html").read_text()
    assert page.count("OpenOOD v1.5") == 1 and CONVENTIONS.split(".")[0] in page
    head = page[:page.index("<h2")]
    assert "Warnings: 2 (method, set) pair(s) with AUROC below 50; 1 method name(s) printed as given" in head
    assert 'href="#warnings"' in head and 'href="warnings.md"' in head
    assert page.index('id="main-table"') < page.index('id="warnings"')  # the details come last
    assert re.search(r'<h2 id="warnings">Warnings</h2>\s*<details>', page)  # collapsed
    details = (out / "warnings.md").read_text()
    assert "| OpenGAN | Generation-based | container | hard | 31.00 |" in details and "opengan" not in details


def test_open_insects_warnings_only_for_table_rows(tmp_path):
    """A rule not chosen on validation appears in no table: its AUROC below 50 is no warning."""
    run = layouts._insect_region(tmp_path, "ne-america", 0)
    results = pd.read_csv(run / "results.csv")
    results.loc[results["method"] == "oe+knn", "auroc"] = 0.2  # oe's chosen rule is msp
    results.loc[(results["method"] == "knn") & (results["ood_set"] == "local"), "auroc"] = 0.3
    results.to_csv(run / "results.csv", index=False)
    write_open_insects([("ne-america", run / "results.csv")], tmp_path / "report", figures="none")
    details = (tmp_path / "report" / "warnings.md").read_text()
    assert "| NE-America | KNN | Post-hoc | local |" in details and "OE + KNN" not in details
    assert "Warnings: 1 (method, set) pair(s) with AUROC below 50" in (tmp_path / "report" / "index.html").read_text()


def test_table7_for_pretrained_runs_and_figure4(tmp_path):
    runs = {r: layouts._insect_region(tmp_path, r, i) for i, r in enumerate(("c-america", "c-america-in1k"))}
    study = tmp_path / "study"
    study.mkdir()
    pd.DataFrame([{"species": n, "images": 800, "ood_set": s, "method": "novel_branch", "auroc": a}
                  for n, a in ((10, 90.0), (100, 95.0))
                  for s in ("local", "non_local")]).to_csv(study / "aux_study.csv",
                                                                                               index=False)
    write_open_insects([(r, p / "results.csv") for r, p in runs.items()], tmp_path / "report",
                       pretrained=["c-america-in1k"], aux_study=study)
    md = (tmp_path / "report" / "table2.md").read_text()
    headers = [line for line in md.splitlines() if line.startswith("| Category | Method |")]
    assert len(headers) == 2 and "c-america-in1k" not in headers[0] and "c-america-in1k: L" in headers[1]
    table4 = (tmp_path / "report" / "table4.md").read_text()
    assert "| From scratch |" in table4 and "| ImageNet-1K |" in table4
    assert_usable_png(tmp_path / "report" / "figure4.png")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Figure 4: AUROC against auxiliary species" in page and "Table 2 and Table 7" in page
    with pytest.raises(ValueError, match="--pretrained"):
        write_open_insects([(r, p / "results.csv") for r, p in runs.items()], tmp_path / "x", pretrained=["nowhere"])


@pytest.mark.skipif(_check_script().find_chromium() is None,
                    reason="Chromium (Debian package `chromium`) not installed")
@pytest.mark.slow
def test_first_screen_holds_the_main_table(bronze_page, capsys):
    """Chromium at 1400 px: Table 3 (18 methods x 9 sets + Average) starts on the first 900 px, fits the window."""
    out, _ = bronze_page
    check = _check_script()
    assert check.main([str(out / "index.html"), "--screenshot", str(out / "shot.png")]) == 0
    printed = capsys.readouterr().out
    top = int(re.search(r"main table: top (\d+) px", printed).group(1))
    width = int(re.search(r"(\d+) px wide", printed).group(1))
    assert top < 400 and width <= 1400 and "19 row(s)" in printed  # 18 methods and the label
    with Image.open(out / "index_first_screen.png") as shot:
        assert shot.size == (1400, 900)
        band = np.asarray(shot.convert("L"))[top:top + 100]
        assert (band < 128).mean() > 0.02  # the table's text is there
    (out / "narrow.html").write_text((out / "index.html").read_text().replace('id="main-table"', 'id="other"'))
    assert check.main([str(out / "narrow.html"), "--screenshot", str(out / "shot2.png")]) == 1
    assert "no main table" in capsys.readouterr().out
