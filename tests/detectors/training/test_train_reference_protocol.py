"""The training-time methods under protocol `open-insects`, against literal transcriptions of the reference trainers:
G-ODIN's two optimisers, MCD's start epoch, full-mode fine-tuning pixels that change every epoch, the protocol
entries."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from detectors import FeatureSet, build
from detectors.harness.protocols import protocol_params
from pipelines.data import make_row, write_manifest
from pipelines.training.loop import second_adam_step


def test_second_adam_step_is_a_second_weight_decay_0_adamw():
    """godin_trainer.py: AdamW(all, lr, wd) then AdamW(h, lr, wd 0), both stepped on the same gradients."""
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(a.detach().clone())
    main_a, main_b = torch.optim.AdamW([a], lr=0.05, weight_decay=0.1), torch.optim.AdamW([b], lr=0.05,
                                                                                          weight_decay=0.1)
    h_optimizer = torch.optim.AdamW([b], lr=0.05, weight_decay=0.0)
    target = torch.randn(4, 3)
    for step in range(6):
        for p, opt in ((a, main_a), (b, main_b)):
            opt.zero_grad()
            h_optimizer.zero_grad()
            ((p - target) ** 3).sum().backward()
        for group in (*main_a.param_groups, *main_b.param_groups):
            group["lr"] = 0.05 * (step + 1) / 6  # the main optimiser is scheduled, h_optimizer is not
        main_a.step()
        second_adam_step(main_a, [a], lr=0.05)
        main_b.step()
        h_optimizer.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_protocol_entries_are_the_reference_trainers():
    for name in ("oe", "logitnorm", "arpl", "novel_branch", "udg"):
        assert protocol_params("open-insects", name) == {"schedule": "reference", "drop_last": False,
                                                         "precision": "fp32", "checkpoint": "best"}
    assert protocol_params("open-insects", "mixoe")["drop_last"] is True
    assert protocol_params("open-insects", "mcd")["start_epoch_ft"] == 90
    assert protocol_params("open-insects", "godin")["h_optimizer"] == "both"
    assert protocol_params("exact", "oe") == {}  # exact: the detectors' own defaults
    oe = build("oe")
    assert (oe.params["schedule"], oe.params["drop_last"], oe.params["augment"]) == ("clean", True, "region")


def _features(n: int, classes: int, seed: int) -> FeatureSet:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    return FeatureSet(rng.normal(size=(n, 8)) + 2 * np.eye(classes, 8)[y], None, y)


def test_mcd_before_its_start_epoch_trains_both_heads_on_id_only(single_torch_thread):
    """start_epoch_ft 90 in a 3-epoch run: the aux term never runs, so the result equals a run without aux rows'
    influence (changing the aux set changes nothing); start_epoch_ft 0 uses them."""
    train, head = _features(40, 3, 0), (np.zeros((3, 8)), np.zeros(3))
    aux_a, aux_b = _features(30, 3, 1), _features(30, 3, 2)
    common = dict(mode="heads", epochs=3, batch_size=16, warmup_epochs=0, lr=0.05, precision="fp32")
    late = [build("mcd", start_epoch_ft=90, **common).fit(train, head=head, aux=aux) for aux in (aux_a, aux_b)]
    np.testing.assert_array_equal(late[0].extra["fc2.weight"], late[1].extra["fc2.weight"])
    early = [build("mcd", start_epoch_ft=0, **common).fit(train, head=head, aux=aux) for aux in (aux_a, aux_b)]
    assert not np.array_equal(early[0].extra["fc2.weight"], early[1].extra["fc2.weight"])


def test_godin_both_optimisers_move_h_further(single_torch_thread):
    train, head = _features(48, 3, 0), (np.zeros((3, 8)), np.zeros(3))
    common = dict(mode="heads", epochs=2, batch_size=16, warmup_epochs=0, lr=0.01, precision="fp32", seed=0)
    split = build("godin", **common).fit(train, head=head)
    both = build("godin", h_optimizer="both", **common).fit(train, head=head)
    assert not np.allclose(split.extra["h.weight"], both.extra["h.weight"])
    assert np.isfinite(both.score(train)).all()


def test_full_mode_fine_tuning_changes_its_input_pixels_every_epoch(tmp_path, single_torch_thread, monkeypatch):
    """Every ID row's pixels differ between epochs (Open-Insect's region preprocessor, `augment: region`); with
    `augment: none` they are the processor's, the same every epoch."""
    from helpers.models import tiny_resnet_classifier

    from detectors.training.logitnorm import LogitNormLoss

    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append(make_row(f"{i}.png", split="train", label=i % 2))
    manifest = write_manifest(tmp_path, rows)
    seen: list[dict[int, bytes]] = []
    original = LogitNormLoss.loss

    def recording(self, logits, features, batch):
        if not seen or len(seen[-1]) == len(rows):
            seen.append({})
        for i, x in zip(batch.index.tolist(), batch.x):
            seen[-1][i] = x.numpy().tobytes()
        return original(self, logits, features, batch)

    monkeypatch.setattr(LogitNormLoss, "loss", recording)
    for augment in ("region", "none"):
        seen.clear()
        clf = tiny_resnet_classifier(tmp_path / f"model_{augment}", classes=2, size=16)
        build("logitnorm", classifier=clf, epochs=3, batch_size=3, warmup_epochs=0, lr=1e-3, augment=augment,
              precision="fp32").fit(manifest)
        assert len(seen) == 3 and all(len(epoch) == len(rows) for epoch in seen)
        changed = [sum(seen[e][i] != seen[e + 1][i] for i in range(len(rows))) for e in range(2)]
        assert changed == ([len(rows)] * 2 if augment == "region" else [0, 0]), (augment, changed)


def test_a_separate_aux_stream_gets_the_evaluation_pixels(tmp_path, single_torch_thread, monkeypatch):
    """OE draws auxiliary batches beside the ID ones: the ID rows are augmented every epoch, the aux rows get the
    reference's test preprocessor (the same pixels every epoch), as its `oe` split does."""
    from helpers.models import tiny_resnet_classifier

    from detectors.training.oe import OELoss
    from pipelines.data import Manifest

    rng = np.random.default_rng(1)
    rows, aux_rows = [], []
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"id{i}.png")
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(tmp_path / f"aux{i}.png")
        rows.append(make_row(f"id{i}.png", split="train", label=i % 2))
        aux_rows.append(make_row(f"aux{i}.png", split="train", role="ood", ood_set="auxiliary"))
    manifest = write_manifest(tmp_path, rows)
    aux = Manifest(tmp_path, aux_rows)
    seen: dict[str, dict[tuple[int, int], bytes]] = {"id": {}, "aux": {}}
    original = OELoss.loss
    epoch = {"steps": 0}

    def recording(self, logits, features, batch):
        e = epoch["steps"] // 2  # 4 ID rows, batch 2: two steps an epoch
        epoch["steps"] += 1
        for i, x in zip(batch.index.tolist(), batch.x):
            seen["id"][(e, i)] = x.numpy().tobytes()
        for i, x in zip(batch.aux_index.tolist(), batch.aux_x):
            seen["aux"][(e, i)] = x.numpy().tobytes()
        return original(self, logits, features, batch)

    monkeypatch.setattr(OELoss, "loss", recording)
    clf = tiny_resnet_classifier(tmp_path / "model", classes=2, size=16)
    build("oe", classifier=clf, epochs=2, batch_size=2, warmup_epochs=0, lr=1e-3, precision="fp32").fit(manifest,
                                                                                                         aux=aux)
    id_changed = [seen["id"][(0, i)] != seen["id"][(1, i)] for i in range(4)]
    aux_both = [i for i in range(4) if (0, i) in seen["aux"] and (1, i) in seen["aux"]]
    assert all(id_changed) and aux_both
    assert all(seen["aux"][(0, i)] == seen["aux"][(1, i)] for i in aux_both)
