"""Geographic open-set splits on a hand-built occurrence table whose answer is known species by species."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gen.insects import (
    AUSTRALIA,
    REGIONS,
    Box,
    SplitConfig,
    build_splits,
    load_region,
    manifest_rows,
    rank_in_group,
    read_id_species,
    read_table,
    summarize,
    synthetic_occurrences,
    write_splits,
)
from pipelines.data import read_manifest

NE = (50.0, -70.0)  # inside NE-America
WE = (55.0, 0.0)  # inside W-Europe
AUS = (-25.0, 135.0)  # inside Australia
FAR = (0.0, 0.0)  # in no box

# species: (genus, family, [(lat, lon, count), ...])
SPECIES = {
    "idA": ("G1", "F1", [(*NE, 10)]),
    "idB": ("G2", "F1", [(*NE, 10), (*AUS, 3)]),  # an ID species also seen in the non-local box
    "locIn": ("G1", "F1", [(41.5, -70.0, 1)]),  # just inside the padded box (lat_min 42 - 1)
    "locEdge": ("G3", "F1", [(41.0, -70.0, 1)]),  # exactly on the padded edge: outside (strict)
    "edgeLon": ("G3", "F1", [(50.0, -83.0, 1)]),  # exactly on the padded longitude edge (-80 - 3)
    "locLon": ("G4", "F2", [(50.0, -82.9, 1)]),  # just inside the padded longitude
    "locFam": ("G5", "F1", [(55.0, -60.0, 2)]),
    "locBig": ("G1", "F1", [(*NE, 40)]),  # > 30 images: 90% test, 10% val
    "outside": ("G6", "F3", [(40.9, -70.0, 1)]),  # just outside the padded box
    "twoReg": ("G8", "F4", [(*WE, 4), (*NE, 2)]),  # ID in W-Europe, local OOD in NE-America
    "weLocal": ("G9", "F4", [(*WE, 3)]),
    "aus1": ("G7", "F3", [(*AUS, 40)]),
    "ausG1": ("G1", "F1", [(*AUS, 5)]),
    "oodGenusOnly": ("G5", "F1", [(*FAR, 2)]),  # genus G5 only in NE-America's OOD
    "ausGenus": ("G7", "F3", [(*FAR, 2)]),  # genus G7 only in non-local OOD
    "auxKeep": ("G1", "F1", [(*FAR, 25)]),
}
ID_SPECIES = pd.DataFrame({"region": ["ne-america", "ne-america", "w-europe"], "species": ["idA", "idB", "twoReg"]})


def table(extra_non_target: int = 20) -> pd.DataFrame:
    rows = []
    for species, (genus, family, places) in SPECIES.items():
        for lat, lon, count in places:
            rows += [dict(species=species, genus=genus, family=family, lat=lat, lon=lon, taxon="moth")] * count
    rows += [dict(species=f"beetle{i % 3}", genus="Gb", family="Fb", lat=50.0, lon=-70.0, taxon="beetle")
             for i in range(extra_non_target)]
    frame = pd.DataFrame(rows)
    frame["file_name"] = [f"img/{i:04d}.jpg" for i in range(len(frame))]
    return frame


# the hand-built table's answers assume these choices: every species kept, 4:1:5, no val cap, every aux species
LEGACY = dict(min_images=1, id_fractions=(0.4, 0.1, 0.5), id_min_rule=False, id_val_cap=None, aux_species=None)


def config(**kw) -> SplitConfig:
    return SplitConfig(regions={k: REGIONS[k] for k in ("ne-america", "w-europe")}, target_taxon="moth", aux_val_size=0,
                       **{**LEGACY, **kw})


def species_in(frame: pd.DataFrame, *sets: str) -> set[str]:
    return set(frame.loc[frame["set"].isin(sets), "species"].astype(object))


@pytest.fixture(scope="module")
def splits():
    return build_splits(table(), read_id_species(ID_SPECIES), config())


def test_local_non_local_and_auxiliary_species_sets(splits):
    ne, we = splits.regions["ne-america"], splits.regions["w-europe"]
    assert species_in(ne, "id_train", "id_val", "id_test") == {"idA", "idB"}
    assert species_in(ne, "local_test", "local_val") == {"locIn", "locLon", "locFam", "locBig", "twoReg"}
    assert species_in(we, "local_test", "local_val") == {"weLocal"}
    # non-local: in Australia minus every region's ID (idB) and local species; the same set for both regions
    assert (species_in(ne, "non_local_test", "non_local_val") == {"aus1", "ausG1"}
            == species_in(we, "non_local_test", "non_local_val"))
    # auxiliary: the rest, without genera found only in OOD (NE: G4, G5, G7, G8; W-Europe: G1, G7, G9)
    assert species_in(ne, "aux_train", "aux_val") == {"locEdge", "edgeLon", "outside", "auxKeep", "weLocal"}
    assert species_in(we, "aux_train", "aux_val") == {"idB", "locEdge", "edgeLon", "locLon", "locFam", "outside",
                                                      "oodGenusOnly"}
    assert species_in(ne, "non_target_test", "non_target_val") == {"beetle0", "beetle1", "beetle2"}


def test_every_image_is_in_at_most_one_set_per_region(splits):
    for frame in splits.regions.values():
        assert not frame["file_name"].duplicated().any()


def test_hops(splits):
    ne = splits.regions["ne-america"]
    hop = ne.groupby(ne["species"].astype(object))["hop"].unique().map(lambda v: sorted(v))
    want = {"idA": [0], "idB": [0], "locIn": [1], "locLon": [3], "locFam": [2], "locBig": [1], "twoReg": [3],
            "aus1": [3], "ausG1": [1], "locEdge": [2], "edgeLon": [2], "outside": [3], "auxKeep": [1], "weLocal": [3]}
    assert {k: hop[k] for k in want} == want
    we = splits.regions["w-europe"]
    we_hop = we.groupby(we["species"].astype(object))["hop"].first()
    assert we_hop["weLocal"] == 2 and we_hop["twoReg"] == 0 and we_hop["aus1"] == 3


def test_split_sizes_and_caps(splits):
    ne = splits.regions["ne-america"]
    counts = ne.groupby([ne["species"].astype(object), ne["set"].astype(object)]).size()
    assert (counts["idA"]["id_train"], counts["idA"]["id_val"], counts["idA"]["id_test"]) == (4, 1, 5)  # 4:1:5
    assert (counts["idB"]["id_train"], counts["idB"]["id_val"], counts["idB"]["id_test"]) == (5, 1, 7)  # 13 images
    assert counts["locBig"]["local_test"] == 36 and counts["locBig"]["local_val"] == 4
    assert counts["locFam"]["local_test"] == 2 and "local_val" not in counts["locFam"]
    assert counts["aus1"]["non_local_test"] == 30 and counts["ausG1"]["non_local_test"] == 5
    assert (ne["set"] == "non_local_val").sum() == 3  # 10% of 35 test images, from aus1's 10 remaining
    assert counts["auxKeep"]["aux_train"] == 20  # 20 a species
    assert (ne["set"] == "non_target_val").sum() == 2 and (ne["set"] == "non_target_test").sum() == 18
    labels = ne.loc[ne["set"].astype(str).str.startswith("id_")].groupby(ne["species"].astype(object))["label"].unique()
    assert labels["idA"].tolist() == [0] and labels["idB"].tolist() == [1]
    assert (ne.loc[~ne["set"].astype(str).str.startswith("id_"), "label"] == -1).all()


def test_caps_and_aux_val_parameters():
    s = build_splits(table(), read_id_species(ID_SPECIES), config(non_local_cap=7, aux_per_species=3, local_cap=10))
    ne = s.regions["ne-america"]
    per = ne.groupby([ne["species"].astype(object), ne["set"].astype(object)]).size()
    assert per["aus1"]["non_local_test"] == 7 and per["auxKeep"]["aux_train"] == 3
    assert per["locBig"].sum() == 10
    with_val = build_splits(table(), read_id_species(ID_SPECIES),
                            SplitConfig(regions=config().regions, target_taxon="moth", **LEGACY))
    ne = with_val.regions["ne-america"]
    assert (ne["set"] == "aux_val").sum() == (ne["set"] == "id_val").sum()  # aux val as large as ID val by default
    aux = ne[ne["set"] == "aux_train"]
    names = sorted(aux["species"].astype(object).unique())
    assert (aux["aux_label"].to_numpy() == [names.index(s) for s in aux["species"].astype(object)]).all()


def test_seeds_reproducible_and_effective():
    ids = read_id_species(ID_SPECIES)
    a = build_splits(table(), ids, config(seed=1)).regions["ne-america"]
    b = build_splits(table(), ids, config(seed=1)).regions["ne-america"]
    c = build_splits(table(), ids, config(seed=2)).regions["ne-america"]
    pd.testing.assert_frame_equal(a, b)
    test_files = lambda f: set(f.loc[f["set"] == "non_local_test", "file_name"])  # noqa: E731
    assert test_files(a) != test_files(c)


def test_given_id_splits_and_clear_errors():
    occ = table()
    occ["split"] = np.where(np.arange(len(occ)) % 2 == 0, "train", "test")
    ne = build_splits(occ, read_id_species(ID_SPECIES), config()).regions["ne-america"]
    id_rows = ne[ne["set"].astype(str).str.startswith("id_")]
    want = occ.set_index("file_name").loc[id_rows["file_name"], "split"].to_numpy()
    assert (id_rows["set"].astype(str).str[3:].to_numpy() == want).all()
    with pytest.raises(ValueError, match="target_taxon"):
        build_splits(table(), read_id_species(ID_SPECIES), SplitConfig(regions=config().regions))
    with pytest.raises(ValueError, match="without a box"):
        build_splits(table(), {"mars": ["idA"]}, config())
    with pytest.raises(ValueError, match="missing column"):
        build_splits(table().drop(columns="lat"), read_id_species(ID_SPECIES), config())


def test_rank_in_group_is_a_permutation_per_group():
    codes = np.array([2, 0, 2, 1, 2, 0])
    rank, size = rank_in_group(codes, np.random.default_rng(0))
    assert size.tolist() == [3, 2, 3, 1, 3, 2]
    for g in range(3):
        assert sorted(rank[codes == g]) == list(range((codes == g).sum()))


def test_box_is_strict_and_parses():
    box = Box.parse("1,2,3,4")
    assert box == Box(1, 2, 3, 4)
    assert box.contains(np.array([1.5, 1.0, 2.0]), np.array([3.5, 3.5, 3.5])).tolist() == [True, False, False]
    assert AUSTRALIA.padded(1, 3) == Box(-45, -9, 110, 157)
    with pytest.raises(ValueError):
        Box.parse("1,2,3")


def test_manifests_written_and_rooted_at_image_root(tmp_path, splits):
    written = write_splits(splits, tmp_path / "splits", image_root=tmp_path / "images")
    manifest = load_region(written["ne-america"])
    assert manifest.root == (tmp_path / "images").resolve()
    raw = read_manifest(written["ne-america"])
    assert len(raw) == len(splits.regions["ne-america"])
    aux = raw.select(ood_set="auxiliary")
    assert all("aux_label" in r for r in aux.rows) and all("aux_label" not in r for r in raw.select(role="id").rows)
    assert {r["ood_set"] for r in raw.select(role="ood").rows} == {"local", "non_local", "non_target", "auxiliary"}
    summary = pd.read_csv(tmp_path / "splits" / "summary.csv")
    row = summary[(summary.region == "ne-america") & (summary.set == "local_test")].iloc[0]
    local = splits.regions["ne-america"].query("set == 'local_test'")
    assert row.images == len(local) and row.hop1 == (local.hop == 1).sum() and row.species == local.species.nunique()
    assert (tmp_path / "splits" / "summary.md").read_text().startswith("| region |")
    assert json.loads((written["w-europe"] / "manifest_info.json").read_text())["config"]["non_local_cap"] == 30


def test_synthetic_table_end_to_end(tmp_path):
    occ, ids = synthetic_occurrences(20_000, seed=3)
    splits = build_splits(occ, read_id_species(ids), SplitConfig(target_taxon="moth"))
    summary = summarize(splits)
    assert set(summary.region) == set(REGIONS)
    for frame in splits.regions.values():
        rows = manifest_rows(frame)
        assert len(rows) == len(frame) and (frame["set"] == "id_train").sum() > 0
        local = species_in(frame, "local_test", "local_val")
        assert not local & species_in(frame, "id_train", "id_val", "id_test")
        assert not local & species_in(frame, "aux_train", "aux_val")


def test_separate_non_target_table():
    occ = table(extra_non_target=0).drop(columns="taxon")
    extra = pd.DataFrame({"file_name": [f"other/{i}.jpg" for i in range(10)], "lat": 1.0, "lon": 2.0})
    ne = build_splits(occ, read_id_species(ID_SPECIES), SplitConfig(regions=config().regions, aux_val_size=0, **LEGACY),
                      non_target=extra).regions["ne-america"]
    nt = ne[ne["set"].isin(["non_target_test", "non_target_val"])]
    assert sorted(nt["file_name"]) == sorted(extra["file_name"]) and (nt["set"] == "non_target_val").sum() == 1
    assert species_in(ne, "local_test", "local_val") == {"locIn", "locLon", "locFam", "locBig", "twoReg"}


def test_make_splits_script_synthetic(tmp_path):
    import importlib.util

    script = importlib.import_module("oodforge.commands.make_splits")
    script.main(["--synthetic", "20000", "--out", str(tmp_path), "--seed", "1"])
    regions = set(pd.read_csv(tmp_path / "synthetic" / "id_species.csv")["region"])
    assert regions and regions <= set(REGIONS)
    for region in regions:
        manifest = load_region(tmp_path / region)
        assert (manifest.root == (tmp_path / "synthetic").resolve()
                and len(manifest.select(role="id", split="train")) > 0)
    assert (tmp_path / "summary.csv").is_file() and (tmp_path / "synthetic" / "occurrences.parquet").is_file()


def test_numeric_species_keys_match_the_id_table():
    occ = table(extra_non_target=0).drop(columns="taxon")
    keys = {name: 1000 + i for i, name in enumerate(SPECIES)}
    occ["species"] = occ["species"].map(keys)
    ids = pd.DataFrame({"region": ["ne-america", "ne-america"], "species": [keys["idA"], keys["idB"]]})
    ne = build_splits(occ, read_id_species(ids), config()).regions["ne-america"]
    assert species_in(ne, "id_train", "id_val", "id_test") == {str(keys["idA"]), str(keys["idB"])}
    assert str(keys["locIn"]) in species_in(ne, "local_test", "local_val")


def _float_keys(occ: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """GBIF-style numeric species keys in a float column (one blank row makes pandas read the column as float)."""
    keys = {name: 1000 + i for i, name in enumerate(SPECIES)}
    occ = occ.copy()
    occ["species"] = occ["species"].map(keys).astype(float)
    occ.loc[len(occ)] = dict(species=np.nan, genus="G1", family="F1", lat=50.0, lon=-70.0, taxon="moth",
                             file_name="img/blank.jpg")
    return occ, keys


def test_float_species_keys_still_match_the_id_table(tmp_path):
    occ, keys = _float_keys(table())
    assert occ["species"].dtype == float  # 1000.0, 1001.0, ... and one NaN
    ids = pd.DataFrame({"region": ["ne-america", "ne-america", "w-europe"],
                        "species": [keys["idA"], keys["idB"], keys["twoReg"]]})
    for source in (occ, None):
        if source is None:  # the same through CSV files, read back by read_table
            occ.to_csv(tmp_path / "occ.csv", index=False)
            ids.to_csv(tmp_path / "ids.csv", index=False)
            source = read_table(tmp_path / "occ.csv")
            got_ids = read_id_species(tmp_path / "ids.csv")
        else:
            got_ids = read_id_species(ids)
        assert got_ids["ne-america"] == [str(keys["idA"]), str(keys["idB"])]
        ne = build_splits(source, got_ids, config()).regions["ne-america"]
        assert species_in(ne, "id_train", "id_val", "id_test") == {str(keys["idA"]), str(keys["idB"])}
        assert not {str(keys["idA"]), str(keys["idB"])} & species_in(ne, "local_test", "local_val")


def test_missing_id_species_is_an_error_unless_allowed():
    ids = {"ne-america": ["idA", "idB", "noSuchSpecies"], "w-europe": ["twoReg"]}
    with pytest.raises(ValueError, match="noSuchSpecies"):
        build_splits(table(), ids, config())
    allowed = build_splits(table(), ids, config(allow_missing_id_species=True))
    assert allowed.missing_id_species["ne-america"] == ["noSuchSpecies"]
    with pytest.raises(ValueError, match="fewer than min_images=5"):  # twoReg has 6 images, idB 13, idA 10: locIn 1
        build_splits(table(), {"ne-america": ["idA", "locIn"]}, config(min_images=5))


def test_id_counts_follow_the_ami_gbif_split():
    from gen.insects import id_counts

    sizes = np.arange(1, 60)
    n_train, n_val = id_counts(sizes, (0.7, 0.1, 0.2))
    test = np.where(sizes >= 5, (2 * sizes + 5) // 10, 0)  # round(0.2 n) half up, only with >= 1/0.2 images
    val = np.where(sizes >= 10, (sizes + 5) // 10, 0)  # round(0.1 n) half up, only with >= 1/0.1 images
    np.testing.assert_array_equal(n_val, val)
    np.testing.assert_array_equal(n_train, sizes - test - val)


def test_open_insects_recipe_numbers_at_a_scaled_size():
    """Synthetic occurrences, the recipe scaled down (8,000 -> 30 aux species, 4,000 -> 15 for C-America): species
    with < 5 images dropped, ID val <= 10 a species (C-America uncapped), aux species with >= 20 images, 20 each."""
    occ, ids = synthetic_occurrences(60_000, seed=4)
    cfg = SplitConfig(target_taxon="moth", aux_species=30, aux_species_by_region={"c-america": 15})
    splits = build_splits(occ, read_id_species(ids), cfg)
    images = occ[occ["taxon"] == "moth"]["species"].astype(str).value_counts()
    for region, frame in splits.regions.items():
        species = frame.loc[~frame["set"].astype(str).str.startswith("non_target"), "species"].astype(str)
        assert images[species.unique()].min() >= 5
        id_rows = frame[frame["set"].astype(str).str.startswith("id_")]
        per = id_rows.groupby([id_rows["species"].astype(str), id_rows["set"].astype(str)]).size().unstack(fill_value=0)
        n = images[per.index].to_numpy()
        want_test = np.where(n >= 5, (2 * n + 5) // 10, 0)
        want_val = np.where(n >= 10, (n + 5) // 10, 0)
        np.testing.assert_array_equal(per["id_test"].to_numpy(), want_test)
        np.testing.assert_array_equal(per["id_train"].to_numpy(), n - want_test - want_val)
        np.testing.assert_array_equal(per.get("id_val", 0) * 1,
                                      want_val if region == "c-america" else np.minimum(want_val, 10))
        assert (want_val > 10).any() or region != "ne-america"  # the cap is exercised
        aux = frame[frame["set"] == "aux_train"]
        per_aux = aux.groupby(aux["species"].astype(str)).size()
        assert len(per_aux) == (15 if region == "c-america" else 30) and (per_aux == 20).all()
