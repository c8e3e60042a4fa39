"""One writer per folder: a live holder refuses a second process, a dead or reused pid's lock is taken over."""
import json
import logging
import os
import signal
import socket
import time

import pytest
from helpers.locks import start_holder as _holder

from pipelines import locks
from pipelines.locks import LOCK_NAME, LOCK_STALE_S, FolderBusy, _start_time, folder_lock


def test_a_live_holder_refuses_a_second_writer_in_one_line(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(FolderBusy) as err:
            with folder_lock(tmp_path, "second"):
                pass
        message = str(err.value)
        assert f"pid {proc.pid} on {socket.gethostname()} (holder" in message and "\n" not in message
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert not (tmp_path / LOCK_NAME).exists()  # released on exit
    with folder_lock(tmp_path, "after"):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["command"] == "after"


def test_a_killed_holders_lock_is_taken_over_and_said_so(tmp_path, caplog):
    proc = _holder(tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / LOCK_NAME).exists()  # kill -9 leaves the file behind
    with caplog.at_level(logging.WARNING, logger="pipelines.locks"):
        with folder_lock(tmp_path, "rerun"):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert any(f"stale lock of pid {proc.pid}" in r.getMessage() for r in caplog.records)


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path):
    # our own pid, but another start time: the process that wrote the lock is gone and its pid was reused
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": "1",
                                                  "command": "old", "since": 0}))
    assert _start_time(os.getpid()) != "1"
    with folder_lock(tmp_path, "new"):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["command"] == "new"


def test_another_hosts_lock_is_kept_while_it_beats_and_taken_over_once_silent(tmp_path, caplog):
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "command": "train", "since": 0}))
    with pytest.raises(FolderBusy, match=r"another host's lock, refreshed \d+ s ago: it is taken over once not "
                                         r"refreshed for 600 s"):
        with folder_lock(tmp_path, "here"):
            pass
    assert json.loads(path.read_text())["host"] == "elsewhere"
    old = time.time() - LOCK_STALE_S - 5  # its holder stopped beating: the run is gone
    os.utime(path, (old, old))
    with caplog.at_level(logging.WARNING, logger="pipelines.locks"):
        with folder_lock(tmp_path, "here"):
            assert json.loads(path.read_text())["host"] == socket.gethostname()
    assert "taking over the stale lock of pid 1 on elsewhere" in caplog.text


def test_a_holder_refreshes_its_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "LOCK_BEAT_S", 0.02)
    with folder_lock(tmp_path, "here") as path:
        old = time.time() - 100
        os.utime(path, (old, old))
        deadline = time.monotonic() + 5
        while time.time() - path.stat().st_mtime > 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert time.time() - path.stat().st_mtime < 50


def test_waiting_takes_the_lock_once_the_holder_finishes(tmp_path):
    proc = _holder(tmp_path)
    proc.stdin.close()  # the holder exits on its own; we wait for it within `wait`
    with folder_lock(tmp_path, "waiter", wait=60, poll=0.01):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["command"] == "waiter"
    proc.wait(timeout=30)


def test_the_lock_file_keeps_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with folder_lock(tmp_path, "mode"):
            assert (tmp_path / LOCK_NAME).stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_a_folder_the_lock_created_is_removed_when_left_empty(tmp_path):
    target = tmp_path / "new" / "out"
    with pytest.raises(RuntimeError):
        with folder_lock(target, "fails"):
            raise RuntimeError("the run failed before writing")
    assert not (tmp_path / "new").exists()  # no empty output folder left behind
    with folder_lock(target, "writes"):
        (target / "result.txt").write_text("kept")
    assert (target / "result.txt").is_file() and not (target / LOCK_NAME).exists()


def test_only_the_main_process_takes_a_multi_process_runs_lock(tmp_path):
    from pipelines.locks import output_lock

    with output_lock(tmp_path, "train", main=False):
        assert not (tmp_path / LOCK_NAME).exists()
    with output_lock(tmp_path, "train", main=True):
        assert (tmp_path / LOCK_NAME).exists()


def test_importers_hold_their_output_folder(tmp_path):
    from helpers.locks import held

    from pipelines.importers import import_classes, import_ood_folders
    from tests.pipelines.own_data_helpers import class_tree, ood_tree

    root, ood = class_tree(tmp_path / "photos", {"train": 1, "test": 1}), ood_tree(tmp_path / "new")
    with held(tmp_path / "out") as holder:
        for run in (lambda: import_classes(root, tmp_path / "out"), lambda: import_ood_folders(ood, tmp_path / "out")):
            with pytest.raises(FolderBusy, match=f"in use by pid {holder.pid} on "):
                run()
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [LOCK_NAME]
