"""Darwin Core Archives read as the DwC-A text guide describes them: the rows python-dwca-reader (the reference reader)
yields, the star join in pandas' inner-merge order, and the layouts GBIF never writes but the guide allows (gaps in
the field indexes, a shared index, an undeclared id column, quoted fields, constants, several files, the guide's
`coreId`, single-quoted namespaces)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers.gbif import (
    DC,
    DWC,
    GBIF,
    GBIF_CORE,
    GBIF_MEDIA,
    MEDIA_TERMS,
    OCC_TERMS,
    archive_xml,
    build_archive,
    gbif_meta,
    section,
    small_gbif,
    tsv,
    write_archive,
)

from pipelines.curation.gbif import KEEP, TableError, read_archive, read_occurrences, read_table


def test_rows_equal_the_reference_readers_star_rows(tmp_path):
    """python-dwca-reader's own rows (core row + its multimedia rows), still images only, columns in KEEP."""
    from dwca.read import DwCAReader

    path, _ = build_archive(tmp_path / "gbif")
    expected = []
    with DwCAReader(str(path)) as reader:
        for row in reader:
            core = {k.rsplit("/", 1)[-1]: v for k, v in row.data.items()}
            core["gbifID"] = row.id
            for ext in row.extensions:
                media = {k.rsplit("/", 1)[-1]: v for k, v in ext.data.items()}
                if media.get("type") not in ("StillImage", ""):
                    continue
                joined = {**{k: v for k, v in core.items() if k not in media or k == "gbifID"},
                          **{k: v for k, v in media.items() if k != "gbifID"}}
                expected.append({k: (v or None) for k, v in joined.items() if k in KEEP})
    frame = read_archive(path)
    got = [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in frame.to_dict("records")]
    assert got == expected and len(got) == 178


def test_join_order_is_pandas_inner_merge_order(tmp_path):
    """Extension rows shuffled, some without a core row, some cores without images, several images a core: the
    rows come out as `core.merge(ext, on=id, how='inner')` orders them."""
    rng = np.random.default_rng(0)
    occ = [dict(gbifID=i, decimalLatitude=1, decimalLongitude=2, species=f"s{i % 7}") for i in range(200)]
    media = [dict(gbifID=int(g), type="StillImage", identifier=f"https://x.org/{k}.jpg")
             for k, g in enumerate(rng.integers(0, 260, 500))]  # ids 200.. have no core row
    rng.shuffle(media)
    core_terms = [GBIF + "gbifID", DWC + "decimalLatitude", DWC + "decimalLongitude", GBIF + "species"]
    meta = archive_xml(section("core", fields=list(enumerate(core_terms))),
                       section("extension", location="multimedia.txt", fields=list(enumerate(MEDIA_TERMS))))
    path = write_archive(tmp_path / "a", {"meta.xml": meta, "occurrence.txt": tsv(core_terms, occ),
                                          "multimedia.txt": tsv(MEDIA_TERMS, media)})
    got = read_archive(path)
    core = pd.DataFrame(occ).astype(str)
    ext = pd.DataFrame(media).astype(str)[["gbifID", "type", "identifier"]]
    want = core.merge(ext, on="gbifID", how="inner")
    assert (got[["gbifID", "species", "identifier"]].values.tolist()
            == want[["gbifID", "species", "identifier"]].values.tolist())


def test_field_indexes_with_gaps_shared_and_out_of_order_name_the_right_columns(tmp_path):
    """Fields declared at 6, 0, 3 (columns 1, 2, 4, 5 undeclared) and two terms on one column: each name reads its
    own column (pandas shifted the names onto the wrong columns)."""
    lines = "h0\th1\th2\th3\th4\th5\th6\n" + "".join(f"{i}\tx\ty\t{50 + i}\tz\tw\t{-70 - i}\n" for i in range(3))
    fields = [(6, DWC + "decimalLongitude"), (0, GBIF + "gbifID"), (3, DWC + "decimalLatitude"),
              (0, DWC + "catalogNumber")]
    path = write_archive(tmp_path / "gaps", {"meta.xml": archive_xml(section("core", fields=fields)),
                                             "occurrence.txt": lines}, zipped=False)
    frame = read_occurrences(path)
    assert frame["lat"].tolist() == ["50", "51", "52"] and frame["lon"].tolist() == ["-70", "-71", "-72"]
    assert frame["gbifID"].tolist() == ["0", "1", "2"]


def test_an_undeclared_id_column_links_the_extension(tmp_path):
    """The guide lets the core's <id> column be no field: here column 0 holds an occurrence URN the multimedia rows
    point at, and gbifID is column 1 (the join used gbifID: 0 rows, then "no url column")."""
    occ, media = small_gbif(3)
    occ_lines = occ.splitlines()
    occ = "\n".join(["urn\t" + occ_lines[0]] + [f"urn:occ:{i}\t" + line for i, line in enumerate(occ_lines[1:])]) + "\n"
    media_rows = [line.split("\t") for line in media.splitlines()]
    media = "\n".join(["\t".join(media_rows[0])] + ["\t".join([f"urn:occ:{i}", *r[1:]])
                                                    for i, r in enumerate(media_rows[1:])]) + "\n"
    meta = gbif_meta([(i + 1, t) for i, t in enumerate(OCC_TERMS)])
    path = write_archive(tmp_path / "urn", {"meta.xml": meta, "occurrence.txt": occ, "multimedia.txt": media})
    frame = read_occurrences(path)
    assert frame["gbifID"].tolist() == ["100", "101", "102"]
    assert frame["url"].tolist() == [f"https://images.example.org/{100 + i}.jpg" for i in range(3)]


def test_quoted_fields_are_read_as_meta_xml_encloses_them(tmp_path):
    """fieldsEnclosedBy='"': a quoted field may hold the separator, a doubled quote and a line break."""
    terms = [GBIF + "gbifID", DWC + "decimalLatitude", DWC + "decimalLongitude", GBIF + "species", DWC + "family"]
    text = ('gbifID\tlat\tlon\tspecies\tfamily\n1\t50\t-70\t"Noc\ttuidae ""x"""\tNoctuidae\n'
            '2\t51\t-71\t"two\nlines"\tErebidae\n')
    meta = archive_xml(section("core", fields=list(enumerate(terms)), attrs={"fieldsEnclosedBy": "&quot;"}))
    frame = read_occurrences(write_archive(tmp_path / "q", {"meta.xml": meta, "occurrence.txt": text}))
    assert frame["species"].tolist() == ['Noc\ttuidae "x"', "two\nlines"] and frame["lat"].tolist() == ["50", "51"]
    guide = archive_xml(section("core", fields=list(enumerate(terms)),  # the guide's defaults: ",", '"'
                                attrs={"fieldsEnclosedBy": None, "fieldsTerminatedBy": None}))
    comma = 'gbifID,lat,lon,species,family\n1,50,-70,"Noctuidae, sp",Noctuidae\n'
    frame = read_occurrences(write_archive(tmp_path / "c", {"meta.xml": guide, "occurrence.txt": comma}))
    assert frame["species"].tolist() == ["Noctuidae, sp"]


def test_constants_defaults_several_files_coreId_and_single_quoted_namespace(tmp_path):
    """A <field> with a default and no index is a constant, with both it fills blanks; a core split over two files;
    the guide's <coreId>; xmlns='...' (python-dwca-reader finds no <core> there)."""
    occ, media = small_gbif(4)
    header, *rows = occ.splitlines()
    at = OCC_TERMS.index(GBIF + "species")
    fields = [f for f in GBIF_CORE if f[0] != at] + [(None, DWC + "countryCode", "CR"),
                                                     (at, GBIF + "species", "Unnamed")]
    core = section("core", fields=fields).replace("<location>occurrence.txt</location>",
                                                  "<location>part1.txt</location><location>./part2.txt</location>")
    ext = section("extension", location="multimedia.txt", fields=GBIF_MEDIA, id_tag="coreId")
    rows[3] = "\t".join(v if i != at else "" for i, v in enumerate(rows[3].split("\t")))  # blank: the default
    files = {"meta.xml": archive_xml(core, ext, xmlns=" xmlns='http://rs.tdwg.org/dwc/text/'"),
             "part1.txt": "\n".join([header, *rows[:2]]) + "\n", "part2.txt": "\n".join([header, *rows[2:]]) + "\n",
             "multimedia.txt": media}
    frame = read_occurrences(write_archive(tmp_path / "d", files))
    assert frame["gbifID"].tolist() == ["100", "101", "102", "103"] and set(frame["countryCode"]) == {"CR"}
    assert frame["species"].tolist() == ["Idmoth sp0", "Idmoth sp1", "Idmoth sp2", "Unnamed"]


def test_crlf_bom_and_a_10_mb_field_are_read(tmp_path):
    occ, media = small_gbif(2)
    big = "x" * (10 * 2**20)
    rows = occ.splitlines()
    rows[1] = rows[1].replace("no escape", big)
    files = {"meta.xml": gbif_meta(attrs={"linesTerminatedBy": "\\r\\n"}),
             "occurrence.txt": "\ufeff" + "\r\n".join(rows) + "\r\n", "multimedia.txt": media}
    frame = read_occurrences(write_archive(tmp_path / "crlf", files))
    assert frame["gbifID"].tolist() == ["100", "101"] and frame["lat"].tolist() == ["50.0", "50.0"]
    table = tmp_path / "t.tsv"
    table.write_text("\ufeffspecies\tlocality\r\na b\t" + big + "\r\n", encoding="utf-8")
    assert read_table(table)["locality"].str.len().tolist() == [len(big)]


def test_terms_outside_gbif_keep_their_names_and_the_media_type_rule(tmp_path):
    """Audubon Core's accessURI is the URL; a blank type is kept, MovingImage and Sound are not."""
    media_terms = [GBIF + "gbifID", DC + "type", "http://rs.tdwg.org/ac/terms/accessURI"]
    occ, _ = small_gbif(3)
    media = tsv(media_terms, [dict(gbifID=100, type="", accessURI="https://a.org/1.jpg"),
                              dict(gbifID=101, type="http://purl.org/dc/dcmitype/StillImage",
                                   accessURI="https://a.org/2.jpg"),
                              dict(gbifID=101, type="MovingImage", accessURI="https://a.org/3.mp4"),
                              dict(gbifID=102, type=" sound ", accessURI="https://a.org/4.mp3")])
    meta = archive_xml(section("core", fields=GBIF_CORE),
                       section("extension", location="multimedia.txt", fields=list(enumerate(media_terms)),
                               row_type="http://rs.tdwg.org/ac/terms/Multimedia"))
    frame = read_occurrences(write_archive(tmp_path / "ac", {"meta.xml": meta, "occurrence.txt": occ,
                                                             "multimedia.txt": media}))
    assert frame["url"].tolist() == ["https://a.org/1.jpg", "https://a.org/2.jpg"]


def test_rows_cut_at_any_byte_read_alike(tmp_path, monkeypatch):
    """Blocks of 7 bytes, so that every row, quote, CRLF and BOM straddles reads: the rows, and the line a ragged row
    is named by, equal those of a whole-file read (Python's csv module as the oracle for the quoted file)."""
    import csv
    import io

    import pipelines.curation.delimited as delimited

    quoted = 'a,b,c\r\n1,"x, ""y""",z\r\n2,"two\r\nlines",w\r\n3,,"last"\r\n4,q,"r\n'
    plain = "\ufeffspecies\tlat\r\n" + "".join(f"s{i}\t{i}.5\r\n" for i in range(40))
    (tmp_path / "q.csv").write_text(quoted, newline="")
    (tmp_path / "p.tsv").write_text(plain, newline="")
    whole = {name: read_table(tmp_path / name) for name in ("q.csv", "p.tsv")}
    monkeypatch.setattr(delimited, "BLOCK", 7)
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(read_table(tmp_path / name), frame)
    rows = list(csv.reader(io.StringIO(quoted, newline="")))
    assert whole["q.csv"].fillna("").values.tolist() == rows[1:]
    (tmp_path / "r.tsv").write_text(plain + "ragged\n" + "s\t1\n")
    with pytest.raises(TableError, match=r"r.tsv: line 42 has 1 fields, the file's first line 2"):
        read_table(tmp_path / "r.tsv")
