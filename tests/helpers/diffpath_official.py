"""Golden DiffPath statistics made by the official code itself (`clear-nus/diffpath` at COMMIT), for
tests/detectors/generative/test_generative_diffpath.py.

Run from the repository root with a checkout of that commit (no other dependency than torch and numpy):

    git clone https://github.com/clear-nus/diffpath /tmp/diffpath && git -C /tmp/diffpath checkout 6f92000
    python tests/helpers/diffpath_official.py /tmp/diffpath

It builds the official `create_model_and_diffusion` at `TINY` (the ImageNet 64x64 model's flags, 32 channels, one res
block), fills the weights with `seeded_state` (a function of the tensors' names and shapes only, so the test rebuilds
them from OpenAI's `guided-diffusion-sdk` UNet, whose tensor names and shapes are the same), inverts `images()` with
the official `ddim_reverse_sample_loop(..., return_eps=True)` and computes the 12 statistics by executing the
official script's own lines (`save_train_statistics.py:48-64, 67-104`, read from the checkout). Writes GOLDEN (JSON).
"""
from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

COMMIT = "6f920001044397469849d4bced8fdd9be7afdfd1"
GOLDEN = Path(__file__).resolve().parents[1] / "detectors" / "generative" / "diffpath_golden.json"
# The official model's flags (configs/imagenet_model_config.yaml over script_util.model_and_diffusion_defaults) with
# 32 channels and one res block: head sizes 24 and 32 at the attended levels, as 96 and 128 in the real model.
TINY = {"image_size": 64, "num_channels": 32, "num_res_blocks": 1, "num_heads": 4, "num_heads_upsample": -1,
        "attention_resolutions": "16,8", "dropout": 0.0, "learn_sigma": True, "sigma_small": False,
        "class_cond": False, "diffusion_steps": 4000, "noise_schedule": "cosine", "use_kl": False,
        "predict_xstart": False, "rescale_timesteps": True, "rescale_learned_sigmas": True, "use_checkpoint": False,
        "use_scale_shift_norm": True, "use_zero_module": True}
STEPS = 10  # the official n_ddim_steps default (save_train_statistics.py:132)
SOURCE_LINES = ((48, 64), (67, 104))  # save_train_statistics.py: the loop's setup and body (1-based, inclusive)


def images(n: int = 3, seed: int = 5) -> np.ndarray:
    """uint8 [n, 64, 64, 3] smooth colour waves plus noise (the test's PIL images)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:64, 0:64] / 64.0
    out = []
    for i in range(n):
        base = np.stack([np.sin(2 * np.pi * (xx * (i + 1) + c / 3.0)) * np.cos(2 * np.pi * yy * (c + 1))
                         for c in range(3)], -1)
        out.append(np.clip(127.5 + 100 * base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8))
    return np.stack(out)


def seeded_state(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights from the names and shapes alone (sorted names, one generator): N(0, 0.05) for matrices and
    kernels, N(0, 0.5) for vectors (the zero-initialised output convolutions get weights too)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shapes[name], generator=gen) * (0.05 if len(shapes[name]) > 1 else 0.5)
            for name in sorted(shapes)}


def official_statistics(checkout: Path) -> tuple[dict[str, list[float]], dict[str, tuple[int, ...]]]:
    """The official code's 12 statistics of `images()` (and the model's tensor shapes)."""
    sys.path.insert(0, str(checkout))
    from improved_diffusion.script_util import create_model_and_diffusion

    model, diffusion = create_model_and_diffusion(**TINY, timestep_respacing=f"ddim{STEPS}")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(seeded_state(shapes))
    model.eval()
    x = torch.from_numpy(images()).permute(0, 3, 1, 2).float() / 255  # ToTensor
    x = (x - 0.5) / 0.5  # Normalize((.5, .5, .5), (.5, .5, .5))
    lines = (checkout / "save_train_statistics.py").read_text().splitlines()
    setup, body = (textwrap.dedent("\n".join(lines[a - 1:b])) for a, b in SOURCE_LINES)
    scope = {"np": np, "diffusion": diffusion, "model": model, "data": (x,),
             "args": types.SimpleNamespace(clip_denoised=True),
             "dist_util": types.SimpleNamespace(dev=lambda: torch.device("cpu"))}
    exec(setup, scope)  # noqa: S102 - the official lines, read from the checkout
    with torch.no_grad():
        exec(body, scope)  # noqa: S102
    names = ("eps_sum", "eps_sum_abs", "eps_sum_sq", "eps_sum_sq_sqrt", "eps_sum_cb", "eps_sum_cb_cbrt", "deps_dt",
             "deps_dt_abs", "deps_dt_sq", "deps_dt_sq_sqrt", "deps_dt_cb", "deps_dt_cb_cbrt")
    return {name: [float(v) for v in scope[f"{name}_arr"]] for name in names}, shapes


def main(checkout: str) -> None:
    stats, shapes = official_statistics(Path(checkout))
    GOLDEN.write_text(json.dumps({"source": f"clear-nus/diffpath@{COMMIT}", "flags": TINY, "steps": STEPS,
                                  "n_parameters": int(sum(np.prod(s) for s in shapes.values())),
                                  "statistics": stats}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main(sys.argv[1])
