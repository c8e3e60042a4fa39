"""Attacks on fetch_images, each a row with its expected outcome: hostile `file_name`s, URL schemes and
redirects, servers that drip, lie about length, throttle, serve bombs or HTML; two fetches on one folder; a ledger
folder deleted; a run killed between an image's rename and its ledger line. Everything runs on the loopback server of
`helpers.http_server`, in-process, in a few seconds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.http_server import HostileServer, png, seed

from oodforge.commands import fetch_images
from pipelines.cli import run_main
from pipelines.curation.fetch_ledger import LEDGER
from pipelines.curation.gbif import image_file_name
from pipelines.locks import folder_lock

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "fetch_images.py"
# keep_ratio keeps a small original byte for byte, so a row can compare what is stored with what the server sent
FAST = ["--backoff", "0.01", "--timeout", "1", "--min-bytes", "100", "--min-side", "32", "--workers", "4",
        "--resize", "keep_ratio"]


@pytest.fixture()
def server():
    with HostileServer() as s:
        yield s


def fetch(argv: list[str]) -> int:
    return run_main(fetch_images.main, argv)


def write_table(path: Path, urls: list[str], file_names: list | None = None) -> Path:
    frame = pd.DataFrame({"url": urls, "species": "Moth a"})
    if file_names is not None:
        frame["file_name"] = file_names
    frame.to_csv(path, index=False)
    return path


def failures(out: Path) -> dict[str, tuple[str, bool]]:
    frame = pd.read_csv(out / "failures.csv", keep_default_na=False)
    return {u: (r, str(f) == "True") for u, r, f in zip(frame["url"], frame["reason"], frame["final"])}


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


# -- 1: paths from the table never leave --out -----------------------------------------------------------------

def test_hostile_file_names_are_refused_per_row_and_nothing_outside_out_is_touched(server, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.jpg").write_bytes(png(1))
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    os.symlink(outside, out / "images" / "link")  # a folder inside out/images that leads outside
    os.symlink(outside / "victim.jpg", out / "images" / "file-link.jpg")  # a file inside that leads outside
    rows = {"/img/1.png": "../escaped.jpg", "/img/2.png": str(outside / "absolute.jpg"),
            "/img/3.png": "images/link/through.jpg", "/img/4.png": "images/file-link.jpg", "/img/5.png": "",
            "/img/6.png": "images/a/../../../up.jpg", "/img/7.png": "images/ok.png", "/img/8.png": "images/ok.png"}
    urls = [server.base + p for p in rows]
    write_table(tmp_path / "occ.csv", urls, list(rows.values()))
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    reasons = failures(out)
    assert len(reasons) == 6 and all(r.startswith("unsafe file_name") and final for r, final in reasons.values())
    assert "blank" in reasons[urls[4]][0] and "absolute" in reasons[urls[1]][0] and "'..'" in reasons[urls[0]][0]
    assert "symlink" in reasons[urls[2]][0] and "symlink" in reasons[urls[3]][0]
    assert pd.read_csv(out / "images.csv")["file_name"].tolist() == ["images/ok.png"]  # the rest went on
    summary = json.loads((out / "fetch_summary.json").read_text())
    assert summary["dropped"] == {"duplicate file_name": 1}  # a second URL never writes over the first's file
    assert files_under(outside) == {"victim.jpg"} and (outside / "victim.jpg").read_bytes() == png(1)
    assert not (tmp_path / "escaped.jpg").exists() and not (tmp_path / "up.jpg").exists()
    assert sum(server.counts.values()) == 1  # refused rows are never requested
    capsys.readouterr()
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["refused"] == 6


def test_a_file_the_ledger_does_not_prove_is_never_deleted_overwritten_or_taken_as_done(server, tmp_path):
    out = tmp_path / "out"
    urls = [server.base + p for p in ("/img/1.png", "/img/2.png", "/img/3.png")]
    victim, stranger, same = (out / image_file_name(u) for u in urls)
    for path in (victim, stranger, same):
        path.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("not an image, not ours")  # not ours: never deleted, even on a fresh --out
    stranger.write_bytes(png(99))  # an image, but not what this URL serves
    same.write_bytes(png(seed("/img/3.png")))  # exactly what the URL serves (say, a ledger lost)
    write_table(tmp_path / "occ.csv", urls)
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    assert victim.read_text() == "not an image, not ours" and stranger.read_bytes() == png(99)
    reasons = failures(out)
    assert set(reasons) == set(urls[:2]) and all("this fetch did not write it" in r for r, _ in reasons.values())
    assert pd.read_csv(out / "images.csv")["url"].tolist() == [urls[2]]  # the identical file is adopted ...
    assert all(server.counts[u.removeprefix(server.base)] == 1 for u in urls)  # ... after a request proved it


def test_images_without_a_ledger_folder_work_and_a_kill_between_rename_and_ledger_line_is_resolved(server, tmp_path):
    out = tmp_path / "out"
    urls = [server.base + f"/img/{i}.png" for i in range(6)]
    write_table(tmp_path / "occ.csv", urls)
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]
    assert fetch(argv) == 0
    ledger = (out / LEDGER).read_text().splitlines()
    # a kill after the rename of urls[0] and urls[1] but before their `ok` lines; urls[1]'s file then replaced
    kept = [line for line in ledger if not (json.loads(line)["status"] == "ok" and json.loads(line)["url"] in urls[:2])]
    (out / LEDGER).write_text("\n".join(kept) + "\n")
    replaced = out / image_file_name(urls[1])
    replaced.write_bytes(png(1234))
    before = dict(server.counts)
    assert fetch(argv) == 0
    assert server.counts["/img/0.png"] == before["/img/0.png"]  # the `writing` line and the hash prove it: no request
    assert failures(out) == {urls[1]: ("file_name exists and this fetch did not write it (its content differs): move "
                                       "it away or use another --out", True)}
    assert replaced.read_bytes() == png(1234)
    shutil.rmtree(out / ".fetch")  # images/ without .fetch/: the rerun adopts the images
    files = {p: p.stat().st_mtime_ns for p in (out / "images").rglob("*.png")}
    assert fetch(argv) == 0 and (out / LEDGER).is_file()
    assert {p: p.stat().st_mtime_ns for p in (out / "images").rglob("*.png")} == files  # adopted, not rewritten
    assert len(pd.read_csv(out / "images.csv")) == 5


# -- 2: only http and https ------------------------------------------------------------------------------------

def test_only_http_and_https_urls_and_redirects(server, tmp_path):
    secret = tmp_path / "secret.png"
    secret.write_bytes(png(7))
    bad = [f"file://{secret}", "file:///dev/zero", "ftp://127.0.0.1/x.png", "data:image/png;base64,iVBORw0KGgo=",
           "gopher://127.0.0.1/x", "javascript:alert(1)", "http:///no-host.png", "http://127.0.0.1:99999/port.png"]
    redirects = [f"/to/1?url=file://{secret}", "/to/2?url=ftp://127.0.0.1/x", "/loop/3", "/chain/4?hops=6",
                 "/chain/5?hops=3", "/img/é 6.png"]
    urls = bad + [server.base + p for p in redirects]
    out = tmp_path / "out"
    write_table(tmp_path / "occ.csv", urls, [f"images/{i}.png" for i in range(len(urls))])
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    reasons = failures(out)
    for url in bad[:6] + [server.base + redirects[0], server.base + redirects[1]]:
        assert reasons[url][0].startswith("refused URL scheme") and reasons[url][1], (url, reasons[url])
    assert reasons[bad[6]] == ("bad URL: no host", True) and reasons[bad[7]][0].startswith("bad URL")
    assert reasons[server.base + "/loop/3"] == ("redirect loop", True)
    assert reasons[server.base + "/chain/4?hops=6"] == ("more than 5 redirects", True)
    assert pd.read_csv(out / "images.csv")["url"].tolist() == [server.base + p for p in redirects[-2:]]
    assert "/img/%C3%A9%206.png" in server.counts  # a space and non-ASCII percent-encoded, not a bad URL
    assert png(7) not in {p.read_bytes() for p in (out / "images").rglob("*.png")}


# -- 4: limits that hold ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_dripping_server_is_cut_at_the_deadline_not_per_read(server, tmp_path):
    """The drip would take 200 s (1000 bytes, one each 0.2 s) and the dripped status line 3.4 s a request; both are
    cut at --timeout 1 (each read alone is well under it)."""
    out = tmp_path / "out"
    urls = [server.base + "/drip/1.jpg", server.base + "/drip-head/2", server.base + "/img/3.png"]
    write_table(tmp_path / "occ.csv", urls)
    start = time.monotonic()
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--retries", "1"]) == 0
    assert time.monotonic() - start < 20
    reasons = failures(out)
    assert reasons[urls[0]] == ("timeout (after 1 retries)", False) and reasons[urls[1]] == reasons[urls[0]]
    assert pd.read_csv(out / "images.csv")["url"].tolist() == [urls[2]]


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # PIL's own note on the 144 MP header
def test_short_bodies_are_retried_truncations_and_size_caps_hold(server, tmp_path):
    out = tmp_path / "out"
    urls = [server.base + p for p in ("/truncate/1.png", "/truncate/2.png?times=1", "/big/3.jpg", "/endless/4.jpg",
                                      "/bomb/5.png", "/bomb/6.png?side=2000", "/html/7.jpg", "/gzip/8.png",
                                      "/jpeg/9.jpg?w=1200&h=900")]
    write_table(tmp_path / "occ.csv", urls)
    argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--retries", "2",
            "--max-bytes", "2000000", "--max-pixels", "5000000"]
    assert fetch(argv) == 0
    reasons = failures(out)
    size = len(png(seed("/truncate/1.png")))
    assert reasons[urls[0]] == (f"truncated ({size // 2} of {size} bytes) (after 2 retries)", False)
    assert server.counts["/truncate/1.png"] == 3  # retried, not a final "not an image"
    assert reasons[urls[2]] == ("larger than max_bytes=2000000 (Content-Length 10000000000)", True)
    assert reasons[urls[3]] == ("larger than max_bytes=2000000", True)
    assert reasons[urls[4]] == ("too many pixels (12000x12000 > max_pixels=5000000)", True)
    assert reasons[urls[5]][0].startswith("not an image")  # 4 MP, under the cap: decoded, and its data is short
    assert reasons[urls[6]] == ("not an image (UnidentifiedImageError)", True)
    assert reasons[urls[7]] == ("not an image (UnidentifiedImageError)", True)  # never gunzipped
    images = pd.read_csv(out / "images.csv")
    assert images["url"].tolist() == [urls[1], urls[8]]  # the truncation that healed, and the JPEG
    assert images.set_index("url").loc[urls[8], ["width", "height", "original_width", "original_height"]].tolist() == \
        [683, 512, 1200, 900]


def test_retry_after_is_honoured_up_to_its_cap(server, tmp_path):
    out = tmp_path / "out"
    urls = [server.base + "/throttle/1.png?retry=1", server.base + "/throttle/2.png?retry=3600"]
    write_table(tmp_path / "occ.csv", urls[:1])
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 0
    times = [t for p, t in server.times if p.startswith("/throttle/1")]
    assert len(times) == 2 and times[1] - times[0] >= 1.0  # the retry waits the 1 s Retry-After asked
    write_table(tmp_path / "occ.csv", urls[1:])
    start = time.monotonic()
    assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(tmp_path / "o2"), *FAST,
                  "--retry-after-max", "0.3"]) == 0
    times = [t for p, t in server.times if p.startswith("/throttle/2")]
    assert len(times) == 2 and times[1] - times[0] >= 0.3 and time.monotonic() - start < 60
    assert len(pd.read_csv(tmp_path / "o2" / "images.csv")) == 1


def test_a_host_that_only_answers_429_is_one_line_exit_2_and_nothing_is_lost(server, tmp_path, capsys):
    """Decided: the throttling host's URLs are transient failures and the other hosts' work goes on and is written;
    then one line names the host and exit 2 says the fetch is not complete. A rerun fetches what is left."""
    with HostileServer() as throttling:
        urls = [throttling.base + f"/status/{i}.png?code=429&retry=0" for i in range(5)] + \
            [server.base + f"/img/{i}.png" for i in range(5)]
        write_table(tmp_path / "occ.csv", urls)
        out = tmp_path / "out"
        argv = ["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST, "--give-up-after", "3"]
        assert fetch(argv) == 2
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert f"{throttling.base.removeprefix('http://')}: 5 URLs after 3 rounds" in errors[0]
        assert "rerun the same command later" in errors[0]
        assert sum(throttling.counts.values()) <= 3 + 4  # 3 rounds, plus what was in flight when the first cut
        reasons = failures(out)
        assert set(reasons) == set(urls[:5]) and all(not final and r.startswith("host throttled") for r, final in
                                                     reasons.values())
        assert sorted(pd.read_csv(out / "images.csv")["url"]) == sorted(urls[5:])
    with HostileServer() as healed:  # the host answers again (its port changed: the table is rewritten)
        urls = [healed.base + f"/img/{i}.png" for i in range(10, 15)] + urls[5:]
        write_table(tmp_path / "occ.csv", urls)
        assert fetch(argv) == 0
        assert len(pd.read_csv(out / "images.csv")) == 10 and sum(healed.counts.values()) == 5


# -- 7: one writer per folder ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_fetch_on_the_same_out_is_refused_in_one_line(tmp_path, capsys):
    with HostileServer(gate_from=0) as server:
        urls = [server.base + f"/gate/{i}.png" for i in range(8)]
        write_table(tmp_path / "occ.csv", urls)
        out = tmp_path / "out"
        cmd = [sys.executable, str(SCRIPT), "--occurrences", str(tmp_path / "occ.csv"), "--out", str(out),
               "--workers", "2", "--min-bytes", "100", "--min-side", "32"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OODFORGE_PROGRESS": "off"}
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert server.wait_blocked(2)  # the first fetch holds the folder and is mid-download
            assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error: ") and "\n" not in err and "in use by pid" in err, err
            assert sum(server.counts.values()) == 2  # the second fetch requested nothing
            server.release.set()
            assert first.wait(120) == 0, first.stderr.read()
        finally:
            first.kill()
            first.stderr.close()
        assert sum(server.counts.values()) == len(urls)  # two fetches on one folder request each URL once
    with folder_lock(out, "fetch_images"):  # the lock also holds in-process
        assert fetch(["--occurrences", str(tmp_path / "occ.csv"), "--out", str(out), *FAST]) == 2
    assert "in use by pid" in capsys.readouterr().err


# -- https: the same client over TLS -----------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_fetches_with_a_trusted_certificate_refuses_an_untrusted_one_and_cuts_a_drip(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with HostileServer(tls=(str(cert), str(key))) as server:
        urls = [server.base + p for p in ("/img/1.png", "/redirect/2.png", "/img/3.png", "/drip/4.jpg")]
        write_table(tmp_path / "occ.csv", urls)
        argv = ["--occurrences", str(tmp_path / "occ.csv"), "--retries", "0", *FAST]
        assert fetch([*argv, "--out", str(tmp_path / "untrusted")]) == 0
        reasons = failures(tmp_path / "untrusted")
        assert all(r.startswith("TLS: certificate verify failed") and final for r, final in reasons.values())
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the certificate trusted, as a CA bundle would
        assert fetch([*argv, "--out", str(tmp_path / "trusted")]) == 0
        assert sorted(pd.read_csv(tmp_path / "trusted" / "images.csv")["url"]) == sorted(urls[:3])
        assert failures(tmp_path / "trusted") == {urls[3]: ("timeout", False)}  # the watchdog cuts TLS reads too
