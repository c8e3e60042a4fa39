"""Runs torchvision's own AugMix for test_augmix.py, under an interpreter that has torchvision (Debian's
/usr/bin/python3 with python3-torchvision 0.14); it imports nothing of this repository.

    /usr/bin/python3 torchvision_augmix.py IN.npz OUT.npz

IN holds `image_<i>` (uint8 [3,H,W]) and `ops.json` (a JSON list of [op, magnitude, interpolation]) and `calls`
(a JSON list of AugMix settings with a torch seed). OUT holds, per image i: `op_<i>_<k>` = `autoaugment._apply_op` of
op k on [1,3,H,W] (fill None, as AugMix calls it); per call j: `call_<j>` = AugMix(...)(image) (the PIL path when
`pil`), and `record.json`: each call's Dirichlet draws (m, the chain weights before the product) and the (op,
magnitude) it applied, chain by chain (read from `_apply_op` and the depth draws).
"""
import json
import sys

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.transforms import InterpolationMode, autoaugment

MODES = {"bilinear": InterpolationMode.BILINEAR, "nearest": InterpolationMode.NEAREST}


def main(src: str, dst: str) -> None:
    data = np.load(src)
    images = [torch.from_numpy(data[k]) for k in sorted(k for k in data.files if k.startswith("image_"))]
    ops = json.loads(str(data["ops"]))
    calls = json.loads(str(data["calls"]))
    out, records = {}, []
    for i, img in enumerate(images):
        for k, (op, magnitude, mode) in enumerate(ops):
            out[f"op_{i}_{k}"] = autoaugment._apply_op(img[None], op, magnitude, MODES[mode], None)[0].numpy()

    events = []
    apply_op = autoaugment._apply_op

    def recorded_apply(img, op_name, magnitude, interpolation, fill):
        events.append(["op", op_name, float(magnitude)])
        return apply_op(img, op_name, magnitude, interpolation=interpolation, fill=fill)

    class Recorded(torchvision.transforms.AugMix):
        def _sample_dirichlet(self, params):
            value = super()._sample_dirichlet(params)
            events.append(["dirichlet", value[0].tolist()])
            return value

    autoaugment._apply_op = recorded_apply
    for j, call in enumerate(calls):
        events.clear()
        aug = Recorded(severity=call["severity"], mixture_width=call["mixture_width"], chain_depth=call["chain_depth"],
                       alpha=call["alpha"], all_ops=call["all_ops"], interpolation=MODES[call["interpolation"]])
        img = images[call["image"]]
        torch.manual_seed(call["seed"])
        randint = torch.randint
        depths = []

        def recorded_randint(*args, randint=randint, depths=depths, **kwargs):
            value = randint(*args, **kwargs)
            if kwargs.get("low") == 1 and kwargs.get("high") == 4:
                depths.append(int(value.item()))
            return value

        torch.randint = recorded_randint
        try:
            if call["pil"]:
                result = torch.from_numpy(np.array(aug(Image.fromarray(img.permute(1, 2, 0).numpy())))).permute(2, 0, 1)
            else:
                result = aug(img)
        finally:
            torch.randint = randint
        out[f"call_{j}"] = result.numpy()
        dirichlet = [e[1] for e in events if e[0] == "dirichlet"]
        applied = [e[1:] for e in events if e[0] == "op"]
        widths = depths if call["chain_depth"] <= 0 else [call["chain_depth"]] * call["mixture_width"]
        chains, at = [], 0
        for depth in widths:
            chains.append(applied[at:at + depth])
            at += depth
        records.append({"m": dirichlet[0], "chain_weights": dirichlet[1], "chains": chains})
    out["record"] = np.array(json.dumps(records))
    np.savez(dst, **out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
