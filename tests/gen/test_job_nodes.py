"""Two nodes on one machine (`torchrun --nnodes 2` on the loopback address, one process each, every node with its
own cache folder and its own host name stand-in, `OODFORGE_HOST`): the tiny models are built on each node by its
local main process, the shard marks say which host ran each share, and an output folder that is not one folder for
both nodes stops both in one line, never a hang."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.data import read_manifest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _two_nodes(config: Path, tmp_path: Path, outs: tuple[Path, Path]) -> list[subprocess.CompletedProcess]:
    """Both nodes started at once; each node's own cache folder, host name and (for the test) `out` override."""
    port = _free_port()
    nodes = []
    for rank, name in enumerate(("node-a", "node-b")):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OODFORGE_CACHE": str(tmp_path / f"{name}-cache"),
               "OODFORGE_HOST": name, "PYTHONPATH": str(REPO)}
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank",
             str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), str(REPO / "scripts" / "generate.py"),
             "--config", str(config), f"out={outs[rank]}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for node in nodes:
        stdout, stderr = node.communicate(timeout=600)
        done.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    return done


def _config(tmp_path: Path, bronzes: Path, containers: Path) -> Path:
    path = tmp_path / "gen.yaml"
    path.write_text(yaml.safe_dump({"task": "transferred_container", "targets": str(containers),
                                    "materials": str(bronzes), "models": "tiny", "resolution": 32,
                                    "num_inference_steps": 2, "batch_size": 1, "limit": 2, "seed": 3,
                                    "precision": "fp32", "out": str(tmp_path / "unused")}))
    return path


@pytest.mark.slow
def test_two_nodes_build_their_own_models_and_share_the_output(tmp_path, bronzes, containers):
    out = tmp_path / "out"
    nodes = _two_nodes(_config(tmp_path, bronzes, containers), tmp_path, (out, out))
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    for name in ("node-a", "node-b"):  # each node's local main process built the tiny models in its own cache
        assert list((tmp_path / f"{name}-cache").glob("tiny_zest-*/zest_config.json"))
    assert len(read_manifest(out, check_files=True)) == 2
    marks = sorted((out / ".job" / "finished").glob("process-[0-9][0-9][0-9].json"))
    assert [yaml.safe_load(p.read_text())["host"] for p in marks] == ["node-a", "node-b"]


@pytest.mark.slow
def test_an_output_folder_each_node_has_alone_stops_both_in_one_line(tmp_path, bronzes, containers):
    nodes = _two_nodes(_config(tmp_path, bronzes, containers), tmp_path, (tmp_path / "a", tmp_path / "b"))
    for node in nodes:
        assert node.returncode != 0
    errors = [line for node in nodes for line in node.stderr.splitlines() if line.startswith("error: out:")]
    assert len(errors) == 2, nodes[0].stderr[-2000:] + nodes[1].stderr[-2000:]
    assert "process(es) 1 on node-b do not see what the main process on node-a writes there" in errors[0]
    assert not (tmp_path / "b" / "metadata.jsonl").exists()
