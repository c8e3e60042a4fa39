"""Golden numbers of OpenOOD's own trainers (mixup, cutmix, regmixup, t2fnorm, ish): one training step of the
reference trainer on tiny.py's network and batch, with its draws (lam, permutation, box) recorded, written to
openood_trainers.json.

Run by hand (not collected by pytest; OpenOOD does not install here):
    python tests/detectors/training/golden/make_openood_trainers.py --git-dir <OpenOOD bare repo> \
        [--commit 3c35632ee91b54b09d1f085d04f94744cece7d0b]
The trainer files and the few they import (FILES) are read from that commit into a temporary `openood` package;
`openood.utils` (Config, comm) and `BasePostprocessor` are stubbed, `.cuda()` is the identity and `np.int` is `int`
(removed from numpy since; `cutmix_trainer.py:102-103` uses it). T2FNorm also records its postprocessor's scores,
ISH the three shapings of `ISHReshaper` on a signed matrix.
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from tiny import TinyNet, batch, state_to_json  # noqa: E402

COMMIT = "3c35632ee91b54b09d1f085d04f94744cece7d0b"
FILES = ["openood/losses/sce.py", "openood/trainers/lr_scheduler.py", "openood/trainers/mixup_trainer.py",
         "openood/trainers/cutmix_trainer.py", "openood/trainers/regmixup_trainer.py",
         "openood/trainers/base_trainer.py",
         "openood/trainers/t2fnorm_trainer.py", "openood/networks/t2fnorm_net.py",
         "openood/postprocessors/t2fnorm_postprocessor.py", "openood/trainers/ish_trainer.py"]
STUBS = {
    "openood/__init__.py": "",
    "openood/utils/__init__.py": "class Config(dict):\n    pass\n",
    "openood/utils/comm.py": "def is_main_process():\n    return True\n\n\ndef gather(x):\n    return [x]\n",
    "openood/losses/__init__.py": "from .sce import soft_cross_entropy\n",
    "openood/trainers/__init__.py": "",
    "openood/networks/__init__.py": "",
    "openood/postprocessors/__init__.py": "",
    "openood/postprocessors/base_postprocessor.py": "class BasePostprocessor:\n    def __init__(self, config):\n"
                                                    "        self.config = config\n",
}
class Loader(list):
    """A list of batches whose iterator has a length, as a DataLoader's (the trainers call len(iter(loader)))."""

    class _Iter:
        def __init__(self, items):
            self.items, self.at = items, 0

        def __len__(self):
            return len(self.items)

        def __next__(self):
            self.at += 1
            return self.items[self.at - 1]

    def __iter__(self):
        return self._Iter([self[i] for i in range(len(self))])


OPTIMIZER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "num_epochs": 100}  # the train_*.yml values
ISH_OPTIMIZER = {**OPTIMIZER, "weight_decay_fc": 0.00005, "nesterov": True}  # train_ish.yml:32-40


def extract(git_dir: str, commit: str, root: Path) -> None:
    for path, text in STUBS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for path in FILES:
        text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        (root / path).write_text(text)


class Recorder:
    """Wraps the RNG calls the trainers make and the loss's backward, recording what they returned."""

    def __init__(self):
        self.draws: list[tuple[str, object]] = []
        self.losses: list[float] = []
        self.inputs: list[torch.Tensor] = []

    def install(self) -> None:
        for name in ("beta", "rand", "randint"):
            original = getattr(np.random, name)

            def wrapped(*args, _original=original, _name=name, **kwargs):
                out = _original(*args, **kwargs)
                self.draws.append((_name, np.asarray(out).tolist()))
                return out
            setattr(np.random, name, wrapped)
        randperm = torch.randperm

        def recorded_randperm(*args, **kwargs):
            out = randperm(*args, **kwargs)
            self.draws.append(("randperm", out.tolist()))
            return out
        torch.randperm = recorded_randperm
        backward = torch.Tensor.backward

        def recorded_backward(tensor, *args, **kwargs):
            self.losses.append(float(tensor.detach()))
            return backward(tensor, *args, **kwargs)
        torch.Tensor.backward = recorded_backward
        torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor
        np.int = int


def one_step(module: str, cls: str, trainer_args: dict, seed: int, recorder: Recorder, width: int = 4,
             optimizer: dict = OPTIMIZER) -> dict:
    trainer_module = importlib.import_module(f"openood.trainers.{module}")
    torch.manual_seed(0)
    backbone = TinyNet(width=width)
    init = state_to_json(backbone)
    net = backbone
    if module == "t2fnorm_trainer":
        net = importlib.import_module("openood.networks.t2fnorm_net").T2FNormNet(backbone, num_classes=3)
    forward = backbone.forward

    def recorded_forward(x, *args, **kwargs):
        recorder.inputs.append(x.detach().clone())
        return forward(x, *args, **kwargs)
    backbone.forward = recorded_forward
    x, y = batch()
    loader = Loader([{"data": x.clone(), "label": y.clone(), "soft_label": torch.nn.functional.one_hot(y, 3).float()}])
    config = SimpleNamespace(trainer=SimpleNamespace(trainer_args=SimpleNamespace(**trainer_args)),
                             optimizer=SimpleNamespace(**optimizer))
    trainer = getattr(trainer_module, cls)(net, loader, config)
    recorder.draws.clear(), recorder.losses.clear(), recorder.inputs.clear()
    np.random.seed(seed)
    torch.manual_seed(seed)
    trainer.train_epoch(0)
    backbone.forward = forward
    out = {"trainer_args": trainer_args, "seed": seed, "width": width, "optimizer": optimizer, "init": init,
           "draws": recorder.draws[:], "loss": recorder.losses[0], "input": recorder.inputs[0].double().tolist(),
           "updated": state_to_json(backbone)}
    if module == "cutmix_trainer":
        boxes, randint = [], np.random.randint
        for lam in (0.0, 1e-9, 0.3, 0.5, 0.77, 0.999, 1.0):
            for cx, cy in ((0, 0), (2, 4), (5, 1), (3, 3), (5, 4)):
                # one fresh iterator per box, made when the lambda is: rand_bbox draws cx then cy
                np.random.randint = lambda high, _c=iter((cx, cy)): next(_c)  # noqa: B008
                boxes.append({"lam": lam, "cx": cx, "cy": cy,
                              "box": [int(v) for v in trainer_module.rand_bbox((4, 3, 6, 5), lam)]})
        np.random.randint = randint
        out["boxes"] = boxes
    if module == "t2fnorm_trainer":
        post = importlib.import_module("openood.postprocessors.t2fnorm_postprocessor").T2FNormPostprocessor(None)
        net.eval()
        with torch.no_grad():
            out["eval_features"] = backbone(x, return_feature=True)[1].double().tolist()
        out["scores"] = post.postprocess(net, x)[1].double().tolist()
        net.num_classes = 1000  # the ImageNet branch: fc(h), no division by tau
        out["scores_1000"] = post.postprocess(net, x)[1].double().tolist()
    if module == "ish_trainer":
        rows = np.random.default_rng(9).normal(size=(3, 10)).astype(np.float32)
        rows[1] = np.abs(rows[1])
        shaped = {}
        for mode in ("minksample_expscale", "expscale", "minksample_lnscale"):
            for param in (0.85, 0.5, 0.0):
                reshaper, ctx = trainer_module.ISHReshaper(mode, param), SimpleNamespace()
                kept = reshaper.select(torch.from_numpy(rows), ctx)
                shaped[f"{mode}@{param}"] = reshaper.pad(kept, ctx).double().tolist()
        out["shaping"] = {"rows": rows.astype(np.float64).tolist(), "shaped": shaped}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git-dir", required=True, help="an OpenOOD git directory holding the commit")
    parser.add_argument("--commit", default=COMMIT)
    parser.add_argument("--out", default=str(HERE / "openood_trainers.json"))
    args = parser.parse_args()
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.git_dir, args.commit, Path(tmp))
        sys.path.insert(0, tmp)
        recorder.install()
        torch.set_num_threads(1)
        cases = {
            "mixup": one_step("mixup_trainer", "MixupTrainer", {"alpha": 0.2}, 0, recorder),
            "mixup_alpha1": one_step("mixup_trainer", "MixupTrainer", {"alpha": 1.0}, 1, recorder),
            "mixup_alpha0": one_step("mixup_trainer", "MixupTrainer", {"alpha": 0.0}, 2, recorder),
            "cutmix": one_step("cutmix_trainer", "CutMixTrainer", {"beta": 1.0, "cutmix_prob": 1.0}, 0, recorder),
            "cutmix_unmixed": one_step("cutmix_trainer", "CutMixTrainer", {"beta": 1.0, "cutmix_prob": 0.0}, 0,
                                       recorder),
            "regmixup": one_step("regmixup_trainer", "RegMixupTrainer", {"alpha": 20.0}, 0, recorder),
            "regmixup_alpha0": one_step("regmixup_trainer", "RegMixupTrainer", {"alpha": 0.0}, 3, recorder),
            "t2fnorm": one_step("t2fnorm_trainer", "T2FNormTrainer", {"tau": 0.1}, 0, recorder),
            "ish": one_step("ish_trainer", "ISHTrainer", {"mode": "minksample_expscale", "param": 0.85, "layer": "r1"},
                            0, recorder, width=20, optimizer=ISH_OPTIMIZER),
        }
    meta = {"openood_commit": args.commit, "torch": torch.__version__, "numpy": np.__version__,
            "optimizer": OPTIMIZER, "made_by": "tests/detectors/training/golden/make_openood_trainers.py"}
    Path(args.out).write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()
