"""Golden numbers of OpenOOD's ASCOOD trainer (ascood_trainer.py at openood_trainers.COMMIT): one training step of the
reference trainer on tiny.py's network wrapped in the reference's `ASCOODNet`, per case: the input gradient
(`get_grad`), the synthesised outliers (`get_ood_sample`), the shuffle draws (`torch.rand_like`), the loss, the weights
after the trainer's own SGD step (its two parameter groups, fc at fc_lr_factor x lr) and, after the step, the scores of
the evaluation the test scripts run (`ScaleNet.forward_threshold` + `ScalePostprocessor`, percentile 85) and the MSP
of the network's own forward. Cases: the train config's defaults (gradient outliers, KL to uniform), the CIFAR-10 and
CIFAR-100 scripts' shuffle outliers, the logistic-regression branch (`kl_div: False`) at a mid-run alpha, a batch of
one row, one class. Writes ascood.json beside this file. The files are the reference's own text at the commit, loaded
by `openood_trainers.load` (`Config` stubbed, `.cuda()` the identity: the step runs on the CPU).

Run by hand (OpenOOD does not install here):
    OPENOOD_GIT=/path/to/OpenOOD/.git python tests/detectors/training/golden/make_ascood.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import openood_trainers as ref  # noqa: E402
from tiny import TinyNet, batch, state_to_json  # noqa: E402

TRAINER_ARGS = {"w": 1.0, "sigma": 0.5, "p_inv": 0.1, "ood_type": "gradient", "alpha_max": 10.0, "alpha_min": 10.0,
                "kl_div": True}  # configs/pipelines/train/train_ascood.yml:21-28
OPTIMIZER = {"num_epochs": 100, "lr": 0.1, "fc_lr_factor": 1.0, "momentum": 0.9, "weight_decay": 0.0005,
             "nesterov": True}  # train_ascood.yml:33-40
CASES = {  # name: (trainer_args over the defaults, optimizer over the defaults, epoch_idx, width, classes, rows, seed)
    "defaults": ({}, {}, 1, 8, 3, 4, 0),
    "shuffle_cifar10": ({"ood_type": "shuffle", "p_inv": 0.15}, {}, 1, 4, 3, 4, 1),  # cifar10_train_ascood.sh
    "shuffle_cifar100": ({"ood_type": "shuffle", "w": 5.0}, {"fc_lr_factor": 0.05}, 1, 4, 3, 4, 2),  # cifar100_...sh
    "logistic": ({"kl_div": False, "alpha_max": 20.0, "alpha_min": 5.0}, {}, 30, 4, 3, 4, 3),
    "one_row": ({}, {}, 1, 4, 3, 1, 4),
    "one_class": ({"ood_type": "shuffle", "p_inv": 0.2}, {}, 1, 4, 1, 4, 5),
}
NO_GRAD = ("shuffle_cifar10", "shuffle_cifar100", "one_class")  # gradients not written (the outliers check them)


def compact(value):
    """Nested lists of float32 values as their shortest decimals (read back as float32, bit for bit)."""
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    return float(str(np.float32(value))) if isinstance(value, float) else value


def case(trainer_mod, net_mod, scale_net, scale_post, args: dict, opt: dict, epoch_idx: int, width: int,
         classes: int, rows: int, seed: int) -> dict:
    torch.manual_seed(100 + seed)
    backbone = TinyNet(classes=classes, width=width)
    backbone.feature_size = width
    net = net_mod.ASCOODNet(backbone)
    init = state_to_json(backbone)
    x, y = batch()
    x, y = x[:rows].clone(), (y[:rows] % classes).clone()
    config = ref.namespace({"trainer": {"trainer_args": {**TRAINER_ARGS, **args}},
                            "optimizer": {**OPTIMIZER, **opt}, "dataset": {"num_classes": classes}})
    trainer = trainer_mod.ASCOODTrainer(net, ref.Batches([{"data": x.clone(), "label": y.clone()}]), config)
    # the logistic regression's 1,538 starting weights are drawn right after the network's (torch.manual_seed(100 +
    # seed), TinyNet, then the trainer's MLP): kept as per-tensor sums and first entries, the test redraws them
    logistic = (None if config.trainer.trainer_args.kl_div else
                {k: {"sum": float(v.double().sum()), "first": ref.as_list(v.flatten()[:4])}
                 for k, v in trainer.logistic_regression.state_dict().items()})
    seen: dict = {"losses": [], "draws": []}
    get_grad, get_ood_sample = trainer.get_grad, trainer.get_ood_sample

    def recorded_grad(data, labels):
        out = get_grad(data, labels)
        seen["grad"] = ref.as_list(out)
        return out

    def recorded_sample(data, target):
        out = get_ood_sample(data, target)
        seen["ood"] = ref.as_list(out)
        return out
    trainer.get_grad, trainer.get_ood_sample = recorded_grad, recorded_sample
    backward, rand_like = torch.Tensor.backward, torch.rand_like

    def recorded_backward(tensor, *a, **k):
        if tensor.dim() == 0:  # the step's loss (get_grad backpropagates the per-row scores)
            seen["losses"].append(float(tensor.detach()))
        return backward(tensor, *a, **k)

    def recorded_rand(*a, **k):
        out = rand_like(*a, **k)
        seen["draws"].append(ref.as_list(out))
        return out
    torch.Tensor.backward, torch.rand_like = recorded_backward, recorded_rand
    torch.manual_seed(seed)
    trainer.train_epoch(epoch_idx)
    torch.Tensor.backward, torch.rand_like = backward, rand_like
    net.eval()
    post_config = ref.namespace({"postprocessor": {"postprocessor_args": {"percentile": 85},
                                                   "postprocessor_sweep": {"percentile_list": [85]}}})
    with torch.no_grad():
        _, features = net(x, return_feature=True)
        scale = scale_post.ScalePostprocessor(post_config).postprocess(scale_net.ScaleNet(net), x)[1]
        msp = torch.softmax(net(x), dim=1).max(1).values
    return {"trainer_args": {**TRAINER_ARGS, **args}, "optimizer": {**OPTIMIZER, **opt}, "epoch_idx": epoch_idx,
            "width": width, "classes": classes, "seed": seed, "init": init, "logistic_init": logistic,
            "rows": rows, "y": y.tolist(), "alpha": getattr(trainer, "alpha", None), "grad": seen["grad"],
            "ood": seen["ood"], "draws": seen["draws"], "loss": seen["losses"][0], "updated": state_to_json(backbone),
            "sigma": float(net.sigma),
            "logistic": (None if logistic is None else
                         {k: ref.as_list(v) for k, v in trainer.logistic_regression.state_dict().items()}),
            "eval_features": ref.as_list(features), "scale_scores": ref.as_list(scale), "msp": ref.as_list(msp)}


def main() -> None:
    torch.set_num_threads(1)
    _, trainer_mod, net_mod, scale_net, _, scale_post = ref.load(
        "openood/trainers/lr_scheduler.py", "openood/trainers/ascood_trainer.py", "openood/networks/ascood_net.py",
        "openood/networks/scale_net.py", "openood/postprocessors/base_postprocessor.py",
        "openood/postprocessors/scale_postprocessor.py")
    cases = {name: case(trainer_mod, net_mod, scale_net, scale_post, *spec) for name, spec in CASES.items()}
    for record in cases.values():  # float32 tensors as float32 decimals; the loss and scalars as they are
        for key in ("init", "logistic_init", "grad", "ood", "draws", "updated", "logistic", "eval_features",
                    "scale_scores", "msp"):
            record[key] = compact(record[key])
    for name in NO_GRAD:
        del cases[name]["grad"]
    print(ref.write("ascood", "make_ascood.py", {"torch": torch.__version__, "defaults": TRAINER_ARGS,
                                                 "optimizer": OPTIMIZER, "cases": cases}))


if __name__ == "__main__":
    main()
