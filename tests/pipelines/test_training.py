"""The shared training loop: loss goes down on a toy task, failures are skipped, multi-level accuracy is right."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, write_manifest
from pipelines.training import MultiGranularity, finetune, train_heads

COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220)]


pytestmark = pytest.mark.usefixtures("single_torch_thread")


class TinyNet(nn.Module):
    """A 2-layer conv net returning (logits, features)."""

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(8, 8), nn.ReLU())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.fc(h), h


def _colour_manifest(folder, n_per_class: int, split: str, rng: np.random.Generator, corrupt: int = 0):
    rows = []
    folder.mkdir(parents=True, exist_ok=True)
    for label, colour in enumerate(COLOURS):
        for i in range(n_per_class):
            noise = rng.integers(-25, 25, size=(16, 16, 3))
            pixels = np.clip(np.array(colour)[None, None] + noise, 0, 255).astype(np.uint8)
            name = f"{split}_{label}_{i}.png"
            Image.fromarray(pixels).save(folder / name)
            rows.append(make_row(name, split=split, label=label, genus=f"g{label // 2}"))
    for i in range(corrupt):
        (folder / f"broken_{i}.png").write_bytes(b"not a png")
        rows.append(make_row(f"broken_{i}.png", split=split, label=0, genus="g0"))
    return write_manifest(folder, rows)


def test_finetune_reduces_loss_and_skips_broken_images(tmp_path):
    rng = np.random.default_rng(0)
    train = _colour_manifest(tmp_path / "train", 8, "train", rng, corrupt=2)
    val = _colour_manifest(tmp_path / "val", 4, "val", rng)
    torch.manual_seed(0)
    clf = ImageClassifier.from_module(TinyNet(), image_size=16)
    result = finetune(clf, train, epochs=6, lr=2e-2, batch_size=8, warmup_epochs=1, val=val, seed=0)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < 0.5 * losses[0]
    assert result.final["acc_label"] == pytest.approx(1.0)
    assert sorted(f.file for f in result.failures) == ["broken_0.png", "broken_1.png"]
    # The classifier was trained in place: its own predictions reproduce the reported validation accuracy.
    clf.eval()
    with torch.no_grad():
        logits, _ = clf(clf.preprocess([Image.open(val.path(r)) for r in val.rows]))
    assert (logits.argmax(1).numpy() == val.labels()).mean() == pytest.approx(result.final["acc_label"])


def test_finetune_is_reproducible(tmp_path):
    rng = np.random.default_rng(1)
    train = _colour_manifest(tmp_path / "train", 4, "train", rng)
    weights = []
    for _ in range(2):
        torch.manual_seed(123)
        clf = ImageClassifier.from_module(TinyNet(), image_size=16)
        finetune(clf, train, epochs=2, lr=1e-2, batch_size=4, warmup_epochs=0, seed=7)
        weights.append(clf.head.weight.detach().clone())
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def test_multi_granularity_reports_per_level_and_overall_accuracy():
    rng = np.random.default_rng(0)
    n, d = 240, 6
    species = rng.integers(0, 4, size=n)
    centres = rng.normal(size=(4, d)) * 3
    x = centres[species] + rng.normal(size=(n, d))
    genus = np.array(["A", "A", "B", "B"])[species]
    family = np.array(["F", "G", "G", "F"])[species]
    flip = rng.random(n) < 0.3  # noisy family labels on validation rows so the levels disagree
    val_family = np.where(flip, np.where(family == "F", "G", "F"), family)
    objective = MultiGranularity({"genus": "genus", "family": "family"}, weights={"family": 0.5})
    head = nn.Linear(d, 4)
    layer, result = train_heads(head, x[:160], species[:160], epochs=15, lr=5e-2, batch_size=32, warmup_epochs=1,
                                objective=objective, train_targets={"genus": genus[:160], "family": family[:160]},
                                val_features=x[160:], val_labels=species[160:],
                                val_targets={"genus": genus[160:], "family": val_family[160:]}, seed=0)
    assert objective.vocab == {"genus": ["A", "B"], "family": ["F", "G"]}
    assert objective.level_heads["genus"].out_features == 2 and layer.out_features == 4
    xv = torch.as_tensor(x[160:], dtype=torch.float32)
    with torch.no_grad():
        right_species = layer(xv).argmax(1).numpy() == species[160:]
        right_genus = np.array(["A", "B"])[objective.level_heads["genus"](xv).argmax(1).numpy()] == genus[160:]
        right_family = np.array(["F", "G"])[objective.level_heads["family"](xv).argmax(1).numpy()] == val_family[160:]
    final = result.final
    assert final["acc_label"] == pytest.approx(right_species.mean())
    assert final["acc_genus"] == pytest.approx(right_genus.mean())
    assert final["acc_family"] == pytest.approx(right_family.mean())
    assert final["overall"] == pytest.approx((right_species & right_genus & right_family).mean())
    assert final["overall"] < final["acc_label"]  # the noisy family level makes some rows fail overall
    assert final["acc_label"] > 0.9
    weight, bias = objective.level_head("genus")
    np.testing.assert_allclose(x[160:] @ weight.T + bias, objective.level_heads["genus"](xv).detach().double().numpy(),
                               rtol=1e-5, atol=1e-5)


def test_multi_granularity_loss_is_weighted_sum_of_cross_entropies():
    objective = MultiGranularity({"genus": "genus"}, weights={"label": 2.0, "genus": 0.5})
    objective.fit_targets({"genus": ["x", "y", "x"]})
    objective.setup(3, 4)
    torch.manual_seed(0)
    logits, features = torch.randn(3, 4), torch.randn(3, 3)
    from pipelines.training import TrainBatch

    targets = {k: torch.as_tensor(v) for k, v in objective.encode_targets({"genus": ["y", "x", "z"]}).items()}
    batch = TrainBatch(x=features, y=torch.tensor([0, 3, 1]), targets=targets)
    got = objective.loss(logits, features, batch)
    with torch.no_grad():
        glog = (features.double() @ objective.level_heads["genus"].weight.double().T
                + objective.level_heads["genus"].bias.double())

    def ce(z, t):
        return float(-(z[t] - torch.logsumexp(z, 0)))

    ce_species = np.mean([ce(logits[i].double(), t) for i, t in enumerate([0, 3, 1])])
    ce_genus = np.mean([ce(glog[0], 1), ce(glog[1], 0)])  # "z" is unseen -> ignored
    assert float(got.detach()) == pytest.approx(2.0 * ce_species + 0.5 * ce_genus, rel=1e-5)


def test_multi_granularity_heads_save_and_load(tmp_path):
    objective = MultiGranularity({"genus": "genus"})
    objective.fit_targets({"genus": ["b", "a", "b"]})
    objective.setup(5, 3)
    loaded = MultiGranularity.from_pretrained(objective.save_pretrained(tmp_path / "levels"))
    assert loaded.vocab == {"genus": ["a", "b"]} and loaded.weights == objective.weights
    for got, want in zip(loaded.level_head("genus"), objective.level_head("genus")):
        np.testing.assert_array_equal(got, want)


def _first_error(stderr: str) -> str:
    """The lines around the first error of a failed torchrun (its tail is only the launcher's own traceback)."""
    lines = stderr.splitlines()
    first = next((i for i, line in enumerate(lines) if "Error" in line or "terminate" in line or "what()" in line), 0)
    return "\n".join(lines[max(0, first - 20): first + 20])


DDP_SCRIPT = """
import json, os, sys, torch
from torch import nn
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.training import MultiGranularity, finetune
torch.set_num_threads(1)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        h = self.body(x)
        return self.fc(h), h
torch.manual_seed(0)
clf = ImageClassifier.from_module(Net(), image_size=16)
objective = MultiGranularity({"genus": "genus"})
manifest = read_manifest(sys.argv[1])
result = finetune(clf, manifest, epochs=2, batch_size=4, lr=1e-2, warmup_epochs=0, objective=objective, val=manifest,
                  seed=0)
# one file per rank: stdout interleaves
with open(os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"steps": result.steps, "loss": result.final["loss"], "head": clf.head.weight.sum().item(),
               "genus": objective.level_heads["genus"].weight.sum().item()}, fh)
if torch.distributed.is_initialized():  # both ranks have written; skip the C++ teardown, which can abort (SIGABRT)
    torch.distributed.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
def test_two_processes_split_each_batch_and_match_one_process(tmp_path):
    """torchrun with 2 CPU processes: each takes half of every global batch, so both run every step (2 epochs x 6
    batches) and end with the weights (model and objective heads) of the one-process run."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    train = _colour_manifest(tmp_path / "data", 8, "train", np.random.default_rng(0))  # 24 rows -> 6 batches of 4
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    root = Path(__file__).parents[2]
    env = {k: v for k,
           v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    solo = subprocess.run([sys.executable, str(script), str(train.root), str(tmp_path)], capture_output=True, text=True,
                          timeout=240, cwd=root, env={**env, "RANK": "solo"})
    assert solo.returncode == 0, solo.stderr[-2000:]
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(train.root),
                           str(tmp_path)],
                          capture_output=True, text=True, timeout=240, cwd=root, env=env)
    assert done.returncode == 0, _first_error(done.stderr)
    one = json.loads((tmp_path / "ranksolo.json").read_text())
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0] == results[1]  # same weights, same (all-reduced) loss on both ranks
    assert results[0]["steps"] == one["steps"] == 2 * 6
    for key in ("loss", "head", "genus"):
        assert results[0][key] == pytest.approx(one[key], rel=1e-4, abs=1e-5)


PARTIAL_SCRIPT = """
import json, os, sys, torch
from torch import nn
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.training import finetune
torch.set_num_threads(1)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        # no bias before batch norm (as ResNets): its gradient is rounding noise, which Adam scales up to steps
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        h = self.body(x)
        return self.fc(h), h
torch.manual_seed(0)
clf = ImageClassifier.from_module(Net(), image_size=16)
manifest = read_manifest(sys.argv[1])
result = finetune(clf, manifest, epochs=2, batch_size=4, lr=1e-2, warmup_epochs=0, seed=0, drop_last=False)
state = {k: v.double().flatten().tolist() for k, v in clf.model.state_dict().items() if v.is_floating_point()}
with open(os.path.join(sys.argv[2], f"partial{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"steps": result.steps, "loss": [h["loss"] for h in result.history], "state": state}, fh)
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("per_class, processes, steps", [(9, 2, 7), (6, 4, 5)])
def test_two_processes_match_one_with_a_partial_last_batch(tmp_path, per_class, processes, steps):
    """27 rows in batches of 4 in 2 processes (the last of 3 rows kept, shared 2 + 1), or 18 rows in 4 processes (the
    last of 2 rows, shared 1 + 1 + 0 + 0: ranks 2 and 3 take the step on no rows, weight 0; a last batch of one row,
    which would leave 2 processes an empty share, is dropped in any process count, as batch norm cannot train on
    it): no process repeats a row, each loss is weighted by its real rows, batch norm spans the
    global batch; weights, batch-norm statistics and the epoch losses equal the one-process run's within float
    tolerance."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    train = _colour_manifest(tmp_path / "data", per_class, "train", np.random.default_rng(0))
    script = tmp_path / "partial.py"
    script.write_text(PARTIAL_SCRIPT)
    root = Path(__file__).parents[2]
    env = {k: v for k,
           v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(root)
    solo = subprocess.run([sys.executable, str(script), str(train.root), str(tmp_path)], capture_output=True, text=True,
                          timeout=240, cwd=root, env={**env, "RANK": "solo"})
    assert solo.returncode == 0, solo.stderr[-2000:]
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", str(processes), str(script),
                           str(train.root), str(tmp_path)], capture_output=True, text=True, timeout=240, cwd=root,
                          env=env)
    assert done.returncode == 0, _first_error(done.stderr)
    one = json.loads((tmp_path / "partialsolo.json").read_text())
    two = [json.loads((tmp_path / f"partial{rank}.json").read_text()) for rank in range(processes)]
    assert all(other == two[0] for other in two[1:])
    assert two[0]["steps"] == one["steps"] == 2 * steps
    np.testing.assert_allclose(two[0]["loss"], one["loss"], rtol=1e-5)
    for name, values in one["state"].items():
        np.testing.assert_allclose(two[0]["state"][name], values, rtol=1e-4, atol=1e-6, err_msg=name)


BROKEN_SHARE_SCRIPT = """
import json, os, sys, torch
from torch import nn
from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.training import finetune
torch.set_num_threads(1)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        h = self.body(x)
        return self.fc(h), h
torch.manual_seed(0)
clf = ImageClassifier.from_module(Net(), image_size=16)
try:
    finetune(clf, read_manifest(sys.argv[1]), epochs=1, batch_size=2, lr=1e-2, warmup_epochs=0, seed=0)
    said = "trained"
except RuntimeError as err:  # as evaluate does with a failing unit: record it and go on to the next collective
    said = str(err)
token = torch.ones(3, dtype=torch.float64)
torch.distributed.all_reduce(token)
rank = torch.distributed.get_rank()
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as fh:
    json.dump({"said": said, "token": token.tolist()}, fh)
torch.distributed.barrier()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_a_share_failing_on_one_process_stops_every_process_at_that_step(tmp_path):
    """Batches of 2 shared 1 + 1, one image unreadable: the process whose share is that image raises its one line at
    the step's agreement (the weight all-reduce, before the forward) and the other stops there too, naming it. Both
    then go on (as evaluate does after a failed unit) and meet in the next collective: neither was left in the
    step's collectives, which would pair with it (or wait for the process group's time-out, 30 minutes)."""
    import json
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    train = _colour_manifest(tmp_path / "data", 2, "train", np.random.default_rng(0), corrupt=1)
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_SHARE_SCRIPT)
    root = Path(__file__).parents[2]
    env = {k: v for k,
           v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(root)
    start = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
                           str(script), str(train.root), str(tmp_path)], capture_output=True, text=True, timeout=300,
                          cwd=root, env=env)
    assert time.monotonic() - start < 120
    assert done.returncode == 0, _first_error(done.stderr)
    said = sorted(json.loads((tmp_path / f"rank{r}.json").read_text())["said"] for r in (0, 1))
    assert said[0].startswith("every image of a training batch share failed to load on process")
    assert said[1].endswith("1 other process(es) could not prepare their share of a training batch (their error "
                            "says why); this process stops with them")
    assert all(json.loads((tmp_path / f"rank{r}.json").read_text())["token"] == [2.0] * 3 for r in (0, 1))


HEADS_SCRIPT = """
import json, os, sys
import numpy as np, torch
from accelerate import PartialState
from pipelines.training import train_heads
torch.set_num_threads(1)
PartialState(cpu=True)
rng = np.random.default_rng(0)
labels = np.repeat(np.arange(3), 20)
features = np.eye(6)[labels] * 3 + rng.normal(size=(60, 6))
layer, result = train_heads((np.zeros((3, 6)), np.zeros(3)), features, labels, epochs=4, lr=5e-2, batch_size=8,
                            warmup_epochs=1, seed=0)
out = {"lrs": result.lrs, "weight": layer.weight.detach().double().tolist(), "steps": result.steps}
# objectives with a pooled ID+aux loader and a per-epoch pass over every row (gathered, de-duplicated)
from detectors.training.novel_branch import BranchLoss
from detectors.training.udg import UDGLoss
aux = np.eye(6)[rng.integers(3, 6, 40)] * 3 + rng.normal(size=(40, 6))
for name, objective in (("pooled", BranchLoss(False, pooled=True)), ("udg", UDGLoss(num_clusters=5, pca_dim=4))):
    layer, result = train_heads((np.zeros((3, 6)), np.zeros(3)), features, labels, aux_features=aux,
                                objective=objective, epochs=2, lr=5e-2, batch_size=8, warmup_epochs=0, seed=0)
    out[name] = layer.weight.detach().double().tolist()
rank = os.environ.get("RANK", "solo")
with open(os.path.join(sys.argv[1], f"heads_{rank}.json"), "w") as fh:
    json.dump(out, fh)
if torch.distributed.is_initialized():  # both ranks have written; skip the C++ teardown, which can abort (SIGABRT)
    torch.distributed.barrier()
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
def test_heads_only_schedule_is_the_same_for_one_and_two_processes(tmp_path):
    """Cached-feature batches are not sharded, so each process takes every step: the cosine schedule and the trained
    head must equal the one-process run (accelerate's scheduler wrapper would step twice a step and end it early).
    Likewise with a pooled ID+aux loader (NovelBranch) and a per-epoch pass over every row (UDG's clustering)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from transformers import get_cosine_schedule_with_warmup

    script = tmp_path / "heads.py"
    script.write_text(HEADS_SCRIPT)
    root = Path(__file__).parents[2]
    env = {k: v for k,
           v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    solo = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=240,
                          cwd=root, env=env)
    assert solo.returncode == 0, solo.stderr[-2000:]
    torchrun = Path(sys.executable).with_name("torchrun")
    duo = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), str(tmp_path)],
                         capture_output=True, text=True, timeout=240, cwd=root, env=env)
    assert duo.returncode == 0, _first_error(duo.stderr)
    one = json.loads((tmp_path / "heads_solo.json").read_text())
    two = [json.loads((tmp_path / f"heads_{rank}.json").read_text()) for rank in (0, 1)]
    # 60 rows, batch 8, drop_last -> 7 steps an epoch, 28 in all, 7 warm-up steps; lr of every step from the schedule
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=5e-2)
    schedule = get_cosine_schedule_with_warmup(optimizer, 7, 28)
    expected = []
    for _ in range(28):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert one["steps"] == 28 and one["lrs"] == pytest.approx(expected, abs=1e-12)
    for result in two:
        assert result["lrs"] == pytest.approx(one["lrs"], abs=1e-12)
        for key in ("weight", "pooled", "udg"):
            np.testing.assert_allclose(result[key], one[key], rtol=0, atol=1e-6)


def test_pooled_loader_shuffles_id_and_aux_rows_into_one_stream():
    """Objectives with `pooled` (NovelBranch / Extended) see batches cut from one shuffled pool of ID + aux rows: every
    batch has batch_size rows in all, and an epoch visits each row of both sets at most once (all but the dropped
    remainder)."""
    from pipelines.training import Objective

    seen: list[tuple[np.ndarray, np.ndarray]] = []

    class Record(Objective):
        uses_aux, pooled = True, True

        def loss(self, logits, features, batch):
            seen.append((batch.index.numpy().copy(), batch.aux_index.numpy().copy()))
            return logits.sum() * 0

    n_id, n_aux, bs = 30, 50, 16
    rng = np.random.default_rng(0)
    labels = np.arange(n_id) % 3
    _, result = train_heads(nn.Linear(4, 3), rng.normal(size=(n_id, 4)), labels,
                            aux_features=rng.normal(size=(n_aux, 4)),
                            aux_labels=np.full(n_aux, -1), objective=Record(), epochs=2, batch_size=bs, seed=0)
    steps = (n_id + n_aux) // bs  # drop_last on the pooled set: 5 steps an epoch, not n_id // bs = 1
    assert result.steps == 2 * steps and len(seen) == 2 * steps
    for epoch in range(2):
        ids = np.concatenate([s[0] for s in seen[epoch * steps:(epoch + 1) * steps]])
        auxs = np.concatenate([s[1] for s in seen[epoch * steps:(epoch + 1) * steps]])
        assert len(ids) + len(auxs) == steps * bs
        assert len(set(ids)) == len(ids) and len(set(auxs)) == len(auxs)
        assert set(ids) <= set(range(n_id)) and set(auxs) <= set(range(n_aux))
    sizes = {len(a) + len(b) for a, b in seen}
    assert sizes == {bs} and len({len(a) for a, _ in seen}) > 1  # the ID share varies from batch to batch
