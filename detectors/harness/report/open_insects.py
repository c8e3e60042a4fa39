"""Open-Insects' layout (`--layout open-insects`, one run per region): the paper's tables and figures.

- Tables 2 / 7: per category (post-hoc, OpenGAN included; training-time regularization; training with auxiliary data)
  and method, per region the AUROC on L / NL / NM and the ID accuracy (one merged value for the post-hoc methods,
  which score one base classifier); Table 7 holds the runs whose classifier started from ImageNet-1K weights.
- Table 4: per pre-training, region and category the best method's precision / recall at the threshold transferred
  to the field set; Table 6: the same rows' novel-species images detected (share of the field set's novel-species
  images, the paper's denominators).
- Table 5: species and images per taxonomic hop, region, local / non-local set (from the splits' summary).
- Figure 1: AUROC across the Table 2 methods per OOD type and region (AUROC < 50 left out, as the paper does);
  Figure 3: the field set's novel species, flagged or missed, for the run's best method; Figure 4: the auxiliary
  diversity study (`scripts/aux_study.py`).

"Best" is always the same criterion: the highest mean AUROC over the run's Table 2 OOD types (L, NL, NM), ties to
the method the paper lists first.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from detectors.harness.report import plots
from detectors.harness.report.aux_study import NUDGE, study_figure, study_title
from detectors.harness.report.html import Section
from detectors.harness.report.names import (
    CATEGORIES,
    OPEN_INSECTS,
    SET_NAMES,
    category,
    method_label,
    region_label,
    set_label,
    set_short,
)
from detectors.harness.report.papers import Run
from detectors.harness.report.render import MISSING, Part, View, number, scale_note
from detectors.harness.report.scores import (
    HOP_LABELS,
    attach_metadata,
    has_sources,
    species_field_table,
    species_summary,
)
from detectors.harness.report.sections import Out, field_sheets
from detectors.harness.report.tables import read_table, text_column
from pipelines.data import read_manifest
from pipelines.errors import UserInputError

PAPER = OPEN_INSECTS
TYPE_HEADERS = ("L", "NL", "NM")
"""Table 2's OOD types in order (their sets' short names, `names.SET_NAMES`); other sets follow under their names."""
PRETRAINING = ("From scratch", "ImageNet-1K")
AUX_STUDY = "aux_study.csv"


# -- rows
# ---------------------------------------------------------------------------------------------------------------
def ood_types(sets) -> list[str]:
    """Sets in Table 2's order: L, NL, NM (by their short names), then the others in order of first appearance."""
    seen = list(dict.fromkeys(sets))
    rank = {h: i for i, h in enumerate(TYPE_HEADERS)}
    known = sorted((s for s in seen if set_short(s) in rank), key=lambda s: rank[set_short(s)])
    return known + [s for s in seen if s not in known]


def type_legend(sets) -> str:
    """`L local, NL non-local, NM non-moth` for the sets that have a short name."""
    return ", ".join(f"{set_short(s)} {set_label(s)}" for s in sets if s in SET_NAMES and set_short(s) != set_label(s))


def chosen_rows(run: Run) -> pd.DataFrame:
    """Table 2/7's rows of one run: every post-hoc method (OpenGAN included), and per training method (`base`) the row
    of the rule chosen on validation (`rule_selection.csv`; its own score without one). Columns `row` (the base or
    the method: the table's key), `category`, `rule`, `method` (the scored method), then the results' columns; rows
    in category then paper order."""
    frame = run.results
    base = text_column(frame["base"]) if "base" in frame.columns else pd.Series("", index=frame.index)
    rule = text_column(frame["rule"]) if "rule" in frame.columns else pd.Series("", index=frame.index)
    frame = frame.assign(base=base, rule=rule)
    picked = {}
    if run.selection is not None:
        for _, pick in run.selection[run.selection["chosen"]].iterrows():
            picked[pick["base"]] = pick["rule"]
    keep = frame["family"].isin(["posthoc", "generative"]) & (frame["base"] == "")
    for b in dict.fromkeys(frame.loc[frame["base"] != "", "base"]):
        keep |= (frame["base"] == b) & (frame["rule"] == picked.get(b, ""))
    out = frame[keep].copy()
    out["row"] = np.where(out["base"] != "", out["base"], out["method"])
    out["category"] = [category(f, b, m) for f, b, m in zip(out["family"], out["base"], out["method"])]
    out = out[out["category"].notna()]
    order = {key: i for i, key in enumerate(_row_keys([out]))}
    return out.iloc[np.argsort([order[k] for k in zip(out["category"], out["row"])], kind="stable")]


def _row_keys(parts: list[pd.DataFrame]) -> list[tuple[str, str]]:
    """(category, row) keys of Table 2 over several runs' chosen rows, in category then paper order."""
    long = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["category", "row"])
    return [(c, m) for c in CATEGORIES for m in PAPER.sorted(long.loc[long["category"] == c, "row"])]


def mean_auroc(rows: pd.DataFrame) -> pd.Series:
    """Per Table 2 row: the mean AUROC over the run's Table 2 OOD types (L, NL, NM when present, else every set)."""
    types = ([s for s in ood_types(rows["ood_set"]) if set_short(s) in TYPE_HEADERS]
             or list(dict.fromkeys(rows["ood_set"])))
    part = rows[rows["ood_set"].isin(types)]
    return part.groupby("row", sort=False)["auroc"].mean()


def best_rows(run: Run, per_category: bool = True) -> pd.DataFrame:
    """The best Table 2 row of each category (or overall): highest `mean_auroc`, ties to the paper's earlier method.
    Columns `category, row, method, mean_auroc`."""
    rows = chosen_rows(run)
    if rows.empty:
        return pd.DataFrame(columns=["category", "row", "method", "mean_auroc"])
    first = rows.drop_duplicates("row").set_index("row")[["category", "method"]]
    first["mean_auroc"] = mean_auroc(rows)
    first["rank"] = range(len(first))  # category, then paper order
    groups = first.groupby("category", sort=False) if per_category else [("", first)]
    picked = [part.sort_values(["mean_auroc", "rank"], ascending=[False, True], kind="mergesort").head(1)
              for _, part in groups]
    return pd.concat(picked).reset_index()[["category", "row", "method", "mean_auroc"]]


BEST_NOTE = ("Best per category: the highest mean AUROC over the region's L, NL and NM sets (Table 2), ties to the "
             "method the paper lists first.")


# -- Table 2 / 7
# --------------------------------------------------------------------------------------------------------
def _marks(values: pd.Series, categories: pd.Series) -> pd.Series:
    """1 for the best (highest, as rendered) of its category, 2 for the best overall, 3 for both."""
    rounded = values.round(2)
    best_in = rounded == rounded.groupby(categories).transform("max")
    best = rounded == rounded.max()
    return (best_in.astype(int) + 2 * best.astype(int)).where(rounded.notna(), 0)


def _shared_block(values: pd.Series, keys: list[tuple[str, str]]) -> tuple[int, int] | None:
    """(first row, rows) of the post-hoc block when it has >= 2 rows that all show one value (one base classifier)."""
    rows = [i for i, k in enumerate(keys) if k[0] == CATEGORIES[0]]
    shown = {number(v) for v in values.iloc[rows]} if rows else set()
    return (rows[0], len(rows)) if len(rows) > 1 and len(shown) == 1 and MISSING not in shown else None


def _rules_note(rules: pd.DataFrame, keys: list[tuple[str, str]]) -> str:
    """`ConfBranch + ViM (NE-America, W-Europe); ...`: the rule each training row was scored with, per region."""
    parts = []
    for key in keys:
        if key[0] == CATEGORIES[0]:
            continue
        by_rule: dict[str, list[str]] = {}
        for region, rule in rules.loc[key].items():
            if isinstance(rule, str):
                by_rule.setdefault(method_label(f"{key[1]}+{rule}" if rule else key[1], PAPER), []).append(
                    region_label(region))
        parts += [f"{label} ({', '.join(regions)})" for label, regions in by_rule.items()]
    return ("Training methods are scored with the post-hoc rule chosen on validation (rule_selection.csv; without "
            f"one, their own score): {'; '.join(parts)}.") if parts else ""


def table2_view(runs: list[Run], title: str, html_id: str = "") -> tuple[View, pd.DataFrame]:
    """Tables 2 / 7 for `runs`: rows (category, method), per region the AUROC of each OOD type and the ID accuracy;
    best per category bold, best overall underlined, per column. Also the flat table (CSV)."""
    chosen = [chosen_rows(r).assign(region=r.name) for r in runs]
    keys = _row_keys(chosen)
    index = pd.MultiIndex.from_tuples(keys, names=["category", "row"])
    long = pd.concat(chosen, ignore_index=True)
    sets = ood_types(long["ood_set"])
    values: dict[tuple[str, str], pd.Series] = {}
    rules, methods = {}, {}
    for run, part in zip(runs, chosen):
        auroc = part.pivot_table(index=["category", "row"], columns="ood_set", values="auroc", sort=False)
        for s in sets:
            values[(run.name, s)] = auroc[s].reindex(index) if s in auroc.columns else pd.Series(np.nan, index=index)
        first = part.drop_duplicates("row").set_index(["category", "row"])
        acc = first["id_acc"] if "id_acc" in first.columns else pd.Series(np.nan, index=first.index)
        values[(run.name, "id_acc")] = acc.reindex(index).astype(np.float64)
        rules[run.name] = first["rule"].reindex(index)
        methods[run.name] = first["method"].reindex(index)
    wide = pd.DataFrame(values, index=index)
    categories = pd.Series([k[0] for k in keys], index=index)
    columns, spans, short, merged, cells = [], [], [], {}, {k: [] for k in keys}
    for run in runs:
        metrics = [*sets, "id_acc"]
        names = [set_short(s) for s in sets] + ["ID acc."]
        columns += [f"{region_label(run.name)}: {n}" for n in names]
        spans.append((region_label(run.name), len(names)))
        short += names
        for metric in metrics:
            series = wide[(run.name, metric)]
            marks = _marks(series, categories)
            if metric == "id_acc" and (block := _shared_block(series, keys)) is not None:
                merged[len(columns) - len(names) + metrics.index(metric)] = [block]
            for key in keys:
                cells[key].append((Part(number(series[key]), int(marks[key])),))
    rows = [((c, method_label(m, PAPER)), cells[(c, m)]) for c, m in keys]
    note = (f"AUROC (%) of ID test against each OOD type ({type_legend(sets)}); ID acc.: top-1 accuracy (%) on ID "
            "test. "
            "Best per category in bold, best overall underlined (both: bold and underlined; markdown: bold italics). "
            "The post-hoc methods (OpenGAN among them) score the region's one base classifier: its ID accuracy is "
            "shown once.")
    rule_frame = pd.DataFrame(rules, index=index)
    extra = [n for n in [_rules_note(rule_frame, keys), scale_note(runs[0].scale)] if n]
    view = View(note, ["Category", "Method"], columns, rows, spans, short, merge_first=True, title=title,
                extra_notes=extra, merged=merged, html_id=html_id)
    flat = pd.DataFrame({"category": [k[0] for k in keys], "row": [k[1] for k in keys]})
    for run in runs:
        for metric in [*sets, "id_acc"]:
            flat[f"{run.name}/{metric}"] = wide[(run.name, metric)].to_numpy()
        flat[f"{run.name}/rule"] = rule_frame[run.name].fillna("").to_numpy()
        flat[f"{run.name}/method"] = pd.Series(methods[run.name]).fillna("").to_numpy()
    return view, flat


def table2_section(out: Out, runs: list[Run]) -> Section:
    groups = [("Table 2", [r for r in runs if not r.pretrained], "trained from scratch"),
              ("Table 7", [r for r in runs if r.pretrained], "from ImageNet-1K weights")]
    groups = [g for g in groups if g[1]]
    views, flats = [], []
    for i, (name, members, how) in enumerate(groups):
        view, flat = table2_view(members, f"{name}: base classifiers {how}", "main-table" if i == 0 else "")
        views.append(view)
        flats.append(flat.assign(table=name))
    title = " and ".join(g[0] for g in groups) + ": AUROC per OOD type and ID accuracy"
    return Section(title, views, out.tables("table2", views, pd.concat(flats, ignore_index=True)))


# -- Tables 4 and 6: the best method per category at the transferred threshold -----------------------------------------
def _pretraining(run: Run) -> str:
    return PRETRAINING[1] if run.pretrained else PRETRAINING[0]


def _best_keys(runs: list[Run]) -> list[tuple[Run, tuple[str, ...], pd.Series]]:
    """(run, row key, best row) for Tables 4 and 6: per pre-training, region (when several) and category."""
    with_region = len(runs) > 1
    out = []
    for pretraining in PRETRAINING:
        for run in (r for r in runs if _pretraining(r) == pretraining):
            for _, best in best_rows(run).iterrows():
                key = (pretraining, *([region_label(run.name)] if with_region else []), best["category"],
                       method_label(best["method"], PAPER))
                out.append((run, key, best))
    return out


def _index_names(runs: list[Run]) -> list[str]:
    return ["Pre-training", *(["Region"] if len(runs) > 1 else []), "Category", "Method"]


def table4_section(out: Out, runs: list[Run]) -> Section | None:
    """Table 4: per pre-training, region and category, the best method's precision and recall of OOD at the threshold
    transferred from `source` to `target` (each run's threshold_transfer.csv)."""
    runs = [r for r in runs if r.transfer is not None and not r.transfer.empty]
    if not runs:
        return None
    pairs = list(dict.fromkeys((s, t) for r in runs for s, t in zip(r.transfer["source"], r.transfer["target"])))
    field = _field_sets(runs)
    pairs = sorted(pairs, key=lambda p: p[1] not in field)  # field-set targets first
    rows, flat = [], []
    for run, key, best in _best_keys(runs):
        indexed = run.transfer.set_index(["method", "source", "target"])
        cells = []
        for source, target in pairs:
            hit = indexed.index.isin([(best["method"], source, target)])
            row = indexed[hit].iloc[0] if hit.any() else None
            for metric in ("precision", "recall"):
                value = np.nan if row is None else _percent(row[metric])
                cells.append((Part(number(value)),))
                flat.append({"pretraining": key[0], "region": run.name, "category": best["category"],
                             "method": best["method"], "source": source, "target": target, "metric": metric,
                             "value": value})
        rows.append((key, cells))
    spans = [(f"{set_label(s)} → {t}", 2) for s, t in pairs]
    columns = [f"{s} → {t}: {m}" for s, t in pairs for m in ("precision", "recall")]
    note = ("Precision and recall (%) of OOD at the threshold chosen on the source set (95% of it detected; flag OOD "
            f"iff score < threshold), computed on the target alone (a field set's own ID images are the negatives). "
            f"{BEST_NOTE}")
    view = View(note, _index_names(runs), columns, rows, spans, ["Precision", "Recall"] * len(pairs), merge_first=True)
    return Section("Table 4: precision and recall at the transferred threshold", [view],
                   out.tables("table4", [view], pd.DataFrame(flat)))


def _percent(value) -> float:
    value = float(value)
    return value * 100 if value <= 1 else value


def _field_sets(runs: list[Run]) -> set[str]:
    return {s for r in runs if r.scores is not None
            for s in r.scores.loc[r.scores["role"] == "field_ood", "ood_set"].unique()}


def _field_rows(run: Run) -> pd.DataFrame | None:
    if run.scores is None or run.transfer is None or not has_sources(run.scores):
        return None
    field = run.scores[run.scores["role"].isin(["field_id", "field_ood"])]
    if field.empty:
        return None
    return attach_metadata(field, ["species"], run.folder)


def table6_section(out: Out, runs: list[Run]) -> Section | None:
    """Table 6: the Table 4 rows' novel species of the field set detected at the transferred threshold: images
    flagged out of the field set's novel-species images (the paper's denominator, 117 images of 59 species for
    BCI), and the species with at least one image flagged."""
    runs = [r for r in runs if r.transfer is not None]
    fields = {r.name: _field_rows(r) for r in runs}
    runs = [r for r in runs if fields[r.name] is not None]
    if not runs:
        return None
    rows, frames = [], []
    for run, key, best in _best_keys(runs):
        per_species = species_field_table(fields[run.name], run.transfer[run.transfer["method"] == best["method"]])
        if per_species.empty:
            continue
        for _, s in species_summary(per_species).iterrows():
            cells = [(Part(f"{s['source']} → {s['target']}"),), (Part(number(s["species"], ".0f")),),
                     (Part(f"{number(s['flagged'], '.0f')} / {number(s['images'], '.0f')}"),),
                     (Part(number(s["images_flagged"])),), (Part(number(s["any"])),)]
            rows.append((key, cells))
        frames.append(per_species.assign(region=run.name, pretraining=key[0], category=best["category"]))
    if not rows:
        return None
    note = ("Novel species of the field set detected at the transferred threshold: images flagged out of the field "
            "set's novel-species images, and that share in percent (the paper's \"species detected\"); species with "
            f"at least one image flagged, in percent of the novel species. {BEST_NOTE}")
    view = View(note, _index_names(runs), ["Threshold", "Novel species", "Images flagged", "Species detected (%)",
                                           "Species with ≥ 1 flagged (%)"], rows, merge_first=True)
    return Section("Table 6: novel species detected in the field set", [view],
                   out.tables("table6", [view], pd.concat(frames, ignore_index=True)))


# -- Table 5
# ------------------------------------------------------------------------------------------------------------
def split_counts(folder: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Table 5's counts from a splits folder: per (region, set, split) `species, images`, per (region, set, split,
    hop) `species, images` (species NaN where only image counts exist), and note lines (rows dropped, shortfalls).
    From `summary.json` (make_splits), else today's `summary.csv`; hops from the region manifests when the summary
    has none."""
    folder = Path(folder)
    sets_columns = ["region", "set", "split", "species", "images"]
    if (folder / "summary.json").is_file():
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or not isinstance(summary.get("sets"), list):
            raise UserInputError(f"{folder / 'summary.json'}: expected an object with a `sets` list")
        sets, hops = [], []
        for entry in summary["sets"]:
            region = entry.get("region") or ""
            name = entry.get("name") or entry.get("set")
            sets.append({"region": region, "set": name, "split": entry.get("split", ""),
                         "species": entry.get("species"), "images": entry.get("images")})
            hops += [{"region": region, "set": name, "split": entry.get("split", ""), **h} for h in entry.get("hops")
                     or []]
        notes = [f"{k}: {v}" for k, v in (summary.get("dropped") or {}).items()]
        notes = ([f"Rows dropped: {', '.join(notes)}."] if notes else []) + \
            [f"Shortfall: {_shortfall(s)}." for s in summary.get("shortfalls") or []]
        table = pd.DataFrame(sets, columns=sets_columns)
        hop_table = pd.DataFrame(hops, columns=["region", "set", "split", "hop", "species", "images"])
    elif (folder / "summary.csv").is_file():
        frame = pd.read_csv(folder / "summary.csv")
        names = frame["set"].astype(str).str.rsplit("_", n=1)
        table = pd.DataFrame({"region": frame["region"], "set": names.str[0].replace({"id": "id"}),
                              "split": names.str[1], "species": frame["species"], "images": frame["images"]})
        hop_cols = [c for c in frame.columns if c.startswith("hop")]
        hop_table = table[["region", "set", "split"]].join(frame[hop_cols]).melt(
            ["region", "set", "split"], hop_cols, "hop", "images")
        hop_table["hop"] = hop_table["hop"].str.removeprefix("hop").astype(int)
        hop_table["species"] = np.nan
        notes = []
    else:
        raise UserInputError(f"--splits {folder}: no summary.json or summary.csv (written by oodforge make-splits)")
    if hop_table.empty:
        hop_table = hop_counts(folder)
    return table, hop_table, notes


def _shortfall(entry) -> str:
    if isinstance(entry, dict) and {"what", "requested", "found"} <= set(entry):
        where = f"{region_label(str(entry['region']))}: " if entry.get("region") else ""
        return f"{where}{entry['requested']} {entry['what']} requested, {entry['found']} found"
    return str(entry)


def hop_counts(folder: str | os.PathLike) -> pd.DataFrame:
    """Species and images per (region, set, split, hop) from the region manifests under a splits folder (the folders
    holding a metadata.jsonl); empty when there are none."""
    rows = []
    for manifest_dir in sorted(p.parent for p in Path(folder).glob("*/metadata.jsonl")):
        frame = pd.DataFrame(read_manifest(manifest_dir).rows)
        if "hop" not in frame.columns or "species" not in frame.columns:
            continue
        frame["set"] = frame["ood_set"].where(frame["role"] == "ood", "id") if "ood_set" in frame else "id"
        frame["hop"] = pd.to_numeric(frame["hop"], errors="coerce").astype("Int64")
        counts = frame.groupby(["set", "split", "hop"], sort=False, dropna=True).agg(
            species=("species", "nunique"), images=("file_name", "size")).reset_index()
        rows.append(counts.assign(region=manifest_dir.name))
    if not rows:
        return pd.DataFrame(columns=["region", "set", "split", "hop", "species", "images"])
    return pd.concat(rows, ignore_index=True)[["region", "set", "split", "hop", "species", "images"]]


HOP_SETS = ("local", "non_local")
"""Table 5's sets: the OOD sets whose species are defined by geography (their taxonomic hops vary)."""


def table5_views(table: pd.DataFrame, hops: pd.DataFrame, notes: list[str]) -> list[View]:
    """Table 5 as printed: rows hop (1 same genus, 2 same family, 3 farther; sorted), then Total; columns region x
    {L, NL} x {species, images} of the test split. Then the species and images per set and split, per region."""
    views = []
    test = hops[(hops["split"] == "test") & hops["set"].isin(HOP_SETS)] if not hops.empty else hops
    if not test.empty:
        views.append(_hop_view(test, notes))
    if not table.empty:
        views.append(_set_split_view(table, "" if views else " " + " ".join(notes)))
    return views


def _hop_view(test: pd.DataFrame, notes: list[str]) -> View:
    """Table 5's per-hop view of the test split's hop counts (rows hop, then Total; columns region x set x count)."""
    regions = list(dict.fromkeys(test["region"]))
    sets = [s for s in HOP_SETS if s in set(test["set"])]
    levels = sorted(int(h) for h in test["hop"].dropna().unique() if int(h) in HOP_LABELS)
    counts = test.assign(hop=test["hop"].astype(int)).groupby(["region", "set", "hop"])[["species", "images"]].sum(
        min_count=1)
    rows = []
    for label, hop in [*((f"{h} ({HOP_LABELS[h]})", h) for h in levels), ("Total", None)]:
        cells = [(Part(number(_hop_count(counts, region, s, column, hop), ".0f")),)
                 for region in regions for s in sets for column in ("species", "images")]
        rows.append(((label,), cells))
    headers = [f"{set_short(s)} {c}" for s in sets for c in ("species", "images")]
    note = ("Species and images of the OOD test sets per taxonomic hop from the ID species (1: same genus, 2: same "
            f"family, 3: farther), per region: {type_legend(sets)}. " + " ".join(notes))
    return View(note, ["Hop"], [f"{region_label(r)}: {h}" for r in regions for h in headers], rows,
                [(region_label(r), len(headers)) for r in regions], headers * len(regions), title="Per hop")


def _hop_count(counts: pd.DataFrame, region: str, s: str, column: str, hop: int | None) -> float:
    """One cell of the per-hop view: the count at `hop`, or (hop None) the total over the hops."""
    if hop is None:  # a species sits at one hop: the hops' counts add up
        part = counts[column].xs((region, s), level=("region", "set"), drop_level=False) \
            if (region, s) in counts.index.droplevel("hop") else pd.Series(dtype=float)
        return part.sum(min_count=1)
    return counts[column].get((region, s, hop), 0)


def _set_split_view(table: pd.DataFrame, note_tail: str) -> View:
    """The species and images per set and split (rows), per region (columns)."""
    regions = list(dict.fromkeys(table["region"]))
    keys = list(dict.fromkeys(zip(table["set"], table["split"])))
    indexed = table.set_index(["region", "set", "split"])
    rows = []
    for s, split in keys:
        cells = []
        for region in regions:
            row = indexed.loc[(region, s, split)] if (region, s, split) in indexed.index else None
            for column in ("species", "images"):
                value = np.nan if row is None else row[column]
                if isinstance(value, pd.Series):
                    value = value.iloc[0]
                cells.append((Part(number(value, ".0f")),))
        name = "ID" if s == "id" else (f"{set_short(s)} ({set_label(s)})" if s in SET_NAMES else s)
        rows.append(((name, split), cells))
    note = "Species and images per set and split of the species splits." + note_tail
    return View(note, ["Set", "Split"],
                [f"{region_label(r)}: {c}" for r in regions for c in ("species", "images")],
                rows, [(region_label(r), 2) for r in regions], ["species", "images"] * len(regions),
                merge_first=True, title="Per set and split")


def table5_section(out: Out, splits: Path) -> Section:
    table, hops, notes = split_counts(splits)
    views = table5_views(table, hops, notes)
    csv = pd.concat([table.assign(part="sets"), hops.assign(part="hops")], ignore_index=True)
    return Section("Table 5: species and images per hop and set", views, out.tables("table5", views, csv))


# -- figures
# ------------------------------------------------------------------------------------------------------------
def figure1_section(out: Out, runs: list[Run]) -> Section:
    """Figure 1: the AUROC of Table 2's rows per OOD type and region; AUROC < 50 left out as in the paper."""
    long = pd.concat([chosen_rows(r).assign(region=region_label(r.name)) for r in runs], ignore_index=True)
    order = ood_types(long["ood_set"])
    frame = long[["region", "ood_set", "row", "auroc"]].rename(columns={"row": "method"})
    frame = frame.assign(_o=frame["ood_set"].map(order.index)).sort_values("_o", kind="mergesort").drop(columns="_o")
    frame["ood_set"] = [f"{set_label(s)} ({set_short(s)})" if set_short(s) != set_label(s) else s
                        for s in frame["ood_set"]]
    low = int((frame["auroc"] < 50).sum())
    images = out.figure(plots.auroc_distribution_figure, "figure1", frame=frame)
    caption = (f"AUROC of the {frame['method'].nunique()} Table 2 methods per OOD type and region (a box per region, "
               f"methods as points). {low} point(s) with AUROC below 50 left out, as the paper does.")
    return Section("Figure 1: AUROC across methods per OOD type and region", images=images,
                   captions={i: caption for i in images})


def figure3_section(out: Out, runs: list[Run], per_species: int = 4) -> Section | None:
    """Figure 3: per region and field set, up to `per_species` novel-species images per species for the run's best
    method (the highest mean AUROC over L, NL, NM; ties: the method the paper lists first) at its transferred
    threshold, each marked flagged or missed."""
    images, captions = [], {}
    for run in runs:
        field = _field_rows(run)
        if field is None:
            continue
        best = best_rows(run, per_category=False)
        if best.empty:
            continue
        method = best["method"].iloc[0]
        made = field_sheets(out, field, run.transfer[run.transfer["method"] == method], f"figure3_{run.name}",
                            region_label(run.name), per_species, paper=PAPER)
        images += made
        captions.update({i: f"{region_label(run.name)}: {method_label(method, PAPER)}, the best Table 2 method "
                            "(highest mean AUROC over L, NL, NM; ties: the paper's order). Red frame: flagged; grey: "
                            "missed." for i in made})
    return Section("Figure 3: novel species in the field set, flagged or missed", images=images,
                   captions=captions) if images else None


def read_aux_study(folder: str | os.PathLike) -> pd.DataFrame:
    """`scripts/aux_study.py`'s table (`species, images, ood_set, method, auroc`) from its folder or the file."""
    path = Path(folder)
    path = path / AUX_STUDY if path.is_dir() else path
    if not path.is_file():
        raise UserInputError(f"--aux-study: {path} not found (oodforge aux-study writes {AUX_STUDY})")
    return read_table(path, ("species", "images", "ood_set", "method", "auroc"), "aux-study table")


def study_table(runs: dict[int, Path], method: str) -> pd.DataFrame:
    """Per species count and OOD set, the AUROC (percent) of `method` in that count's run: its row with the rule
    chosen on validation (rule_selection.csv), else its own score. Columns `species, images, ood_set, method, auroc`."""
    parts = []
    for count, results in sorted(runs.items()):
        run = Run.read(str(count), results, scores=False)
        rows = chosen_rows(run)
        rows = rows[rows["row"] == method]
        if rows.empty:
            raise UserInputError(f"aux study: {results} has no row of method {method!r}")
        stamp = Path(results).parent / "aux" / "subsample.json"
        images = json.loads(stamp.read_text(encoding="utf-8"))["images"] if stamp.is_file() else np.nan
        parts.append(pd.DataFrame({"species": count, "images": images, "ood_set": rows["ood_set"],
                                   "method": rows["method"], "auroc": rows["auroc"]}))
    return pd.concat(parts, ignore_index=True)


def figure4_section(out: Out, study: pd.DataFrame) -> Section:
    """Figure 4: AUROC per OOD set against the number of auxiliary species at a fixed image budget (log x)."""
    images = out.figure(study_figure, "figure4", table=study, title=study_title(study))
    caption = (f"Auxiliary diversity: AUROC (%) per OOD set against the number of auxiliary species (log scale) at a "
               f"fixed budget of auxiliary images. Sets are nudged apart on x (x{NUDGE:g} per set) and drawn with "
               "their "
               "own markers, so that equal values stay visible.")
    return Section("Figure 4: AUROC against auxiliary species", images=images, captions={i: caption for i in images})


def open_insects_sections(out: Out, runs: list[Run], splits: Path | None,
                          aux_study: Path | None = None) -> list[Section]:
    """Every Open-Insects section whose inputs exist, Table 2 first."""
    sections = [table2_section(out, runs)]
    for make in (lambda: table4_section(out, runs), lambda: table5_section(out, splits) if splits else None,
                 lambda: table6_section(out, runs), lambda: figure1_section(out, runs),
                 lambda: figure3_section(out, runs),
                 lambda: figure4_section(out, read_aux_study(aux_study)) if aux_study else None):
        section = make()
        if section is not None and (section.views or section.images):
            sections.append(section)
    return sections


def table_methods(runs: list[Run]) -> dict[str, set[str]]:
    """Per run, the scored methods its tables show (Table 2's chosen rows): warnings are about these only."""
    return {r.name: set(chosen_rows(r)["method"]) for r in runs}


__all__ = ["PAPER", "TYPE_HEADERS", "PRETRAINING", "ood_types", "type_legend", "chosen_rows", "mean_auroc",
           "best_rows", "table2_view", "table2_section", "table4_section", "table6_section", "split_counts",
           "hop_counts", "table5_views", "table5_section", "figure1_section", "figure3_section", "study_table",
           "read_aux_study", "figure4_section", "open_insects_sections", "table_methods"]
