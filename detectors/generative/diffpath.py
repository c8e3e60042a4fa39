"""DiffPath (Heng, Thiery & Soh, NeurIPS 2024): OOD detection with one unconditional diffusion model, from the shape of
the deterministic DDIM path that carries an image to noise.

Each image is inverted with DDIM (eta 0) over `steps` respaced steps; at step k the model's noise prediction
eps_k (re-derived from the clipped predicted clean image) is recorded. Per image, the official code saves sums over
pixels and steps of eps, |eps|, eps^2, eps^3 and of the rate of change deps/dt = (eps_{k+1} - eps_k) * steps, with the
square and cube roots of the second and third sums (`STATISTICS`). DiffPath-6D fits a Gaussian mixture (after
standardising; components and covariance type chosen by 10-fold cross-validated likelihood) to six of them on the ID
training set, DiffPath-1D a Gaussian KDE (bandwidth 5) to the root of the summed squared rate of change. Score = the
log-density under that model (higher = ID).

Reference: `clear-nus/diffpath` (6f92000): `save_train_statistics.py:48-104` (inversion and statistics; the test
set's `save_test_statistics.py` is the same), `improved_diffusion/gaussian_diffusion.py:529-565` (reverse DDIM step, eps
at `:553-556`), `:567-611` and `:639-660` (the loop from respaced index 0), `improved_diffusion/respace.py:30-37`
("ddimN"), `:117-123` (the model sees t * 1000 / T), `eval_6d.py:11-19, 38-52` (statistics and mixture),
`eval_1d.py:8-10, 23, 29` (statistic and KDE),
`configs/imagenet_model_config.yaml` with `improved_diffusion/script_util.py:11-36` (the model and its schedule: the
argparser default `model="imagenet"`, `save_train_statistics.py:128-132`).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from detectors.base import Detector, ImageSet
from detectors.generative.guided_diffusion import CHECKPOINT_SUFFIXES
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress as progress_bar
from pipelines.runtime import enable_attention, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

# improved-diffusion's ImageNet 64x64 unconditional L_hybrid model (imagenet64_uncond_100M_1500K.pt), the one the
# official code runs by default: configs/imagenet_model_config.yaml over script_util.model_and_diffusion_defaults
# (num_heads 4 at every width, attention at 16 and 8 px, scale-shift norm).
IMPROVED_64_UNCOND: dict[str, Any] = {
    "image_size": 64, "num_channels": 128, "num_res_blocks": 3, "num_heads": 4, "num_heads_upsample": -1,
    "attention_resolutions": "16,8", "channel_mult": "1,2,3,4", "dropout": 0.0, "class_cond": False,
    "learn_sigma": True, "use_scale_shift_norm": True, "diffusion_steps": 4000, "noise_schedule": "cosine",
}
# The authors' CelebA 32x32 model (huggingface ajrheng/diffpath, its CelebA EMA checkpoint,
# configs/celeba_model_config.yaml; create_model's 32 px multipliers; dropout 0.3 is inert at inference).
CELEBA_32_UNCOND: dict[str, Any] = {**IMPROVED_64_UNCOND, "image_size": 32, "channel_mult": "1,2,2,2", "dropout": 0.3}
DEFAULT_CHECKPOINT = "imagenet64_uncond_100M_1500K.pt"
CHECKPOINT_URL = "https://openaipublic.blob.core.windows.net/diffusion/march-2021/imagenet64_uncond_100M_1500K.pt"

STATISTICS = ("eps_sum", "eps_sum_abs", "eps_sum_sq", "eps_sum_sq_sqrt", "eps_sum_cb", "eps_sum_cb_cbrt",
              "deps_dt", "deps_dt_abs", "deps_dt_sq", "deps_dt_sq_sqrt", "deps_dt_cb", "deps_dt_cb_cbrt")
"""Per-image path statistics in the order the official code saves them (save_train_statistics.py:121-124)."""
VARIANTS: dict[str, tuple[str, ...]] = {
    "6d": ("eps_sum", "eps_sum_sq", "eps_sum_cb", "deps_dt", "deps_dt_sq", "deps_dt_cb"),  # eval_6d.py:11-19
    "1d": ("deps_dt_sq_sqrt",),  # eval_1d.py:8-10
}
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


# -- schedule -------------------------------------------------------------------------------------------------
def alphas_cumprod(schedule: str, num_timesteps: int, max_beta: float = 0.999) -> np.ndarray:
    """improved-diffusion's named beta schedules as cumulative products of (1 - beta), float64: "cosine"
    (abar(t) = cos^2((t + 0.008) / 1.008 * pi / 2), betas capped at `max_beta`) or "linear" (1e-4 .. 0.02 scaled
    by 1000 / T)."""
    if schedule == "cosine":
        f = np.cos((np.arange(num_timesteps + 1, dtype=np.float64) / num_timesteps + 0.008) / 1.008 * np.pi / 2) ** 2
        betas = np.minimum(1 - f[1:] / f[:-1], max_beta)
    elif schedule == "linear":
        scale = 1000 / num_timesteps
        betas = np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)
    else:
        raise ValueError(f"noise_schedule must be 'cosine' or 'linear', got {schedule!r}")
    return np.cumprod(1.0 - betas)


def ddim_timesteps(num_timesteps: int, steps: int) -> np.ndarray:
    """improved-diffusion's "ddimN" respacing: range(0, T, i) for the smallest integer stride i giving exactly N
    timesteps (an error where none does)."""
    for stride in range(1, num_timesteps):
        if len(range(0, num_timesteps, stride)) == steps:
            return np.arange(0, num_timesteps, stride)
    raise ValueError(f"cannot create exactly {steps} DDIM steps from {num_timesteps} with an integer stride")


@dataclass
class DDIMPath:
    """An epsilon-prediction UNet (`UNet2DModel`; learned-sigma outputs: the first 3 channels are epsilon) on a
    respaced DDIM schedule, inverting images and summing their path statistics. The state runs in float32 (the
    model in `dtype`; a float64 model keeps a float64 state), the sums in float64."""

    unet: torch.nn.Module
    timesteps: np.ndarray  # [S] training timesteps of the respaced indices
    alphas_cumprod: np.ndarray  # [S] float64 abar at those timesteps
    num_timesteps: int  # training timesteps T (the model sees t * 1000 / T, improved-diffusion's rescale_timesteps)
    clip_denoised: bool = True
    dtype: torch.dtype = torch.float32

    @classmethod
    def build(cls, unet: torch.nn.Module, steps: int, num_timesteps: int, schedule: str, clip_denoised: bool = True,
              dtype: torch.dtype = torch.float32) -> DDIMPath:
        ts = ddim_timesteps(num_timesteps, steps)
        return cls(unet, ts, alphas_cumprod(schedule, num_timesteps)[ts], num_timesteps, clip_denoised, dtype)

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    @property
    def state_dtype(self) -> torch.dtype:
        """float32, or float64 for a float64 model (checks)."""
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def eps(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """The model's raw noise prediction at respaced index k (in `state_dtype`)."""
        t = torch.full((len(x),), float(self.timesteps[k]) * 1000.0 / self.num_timesteps, device=x.device,
                       dtype=self.state_dtype)
        out = self.unet(x.to(self.dtype), t).sample
        return out[:, : x.shape[1]].to(self.state_dtype)

    @torch.no_grad()
    def path_eps(self, x0: torch.Tensor):
        """Yield eps_k, k = 0..S-1, along the DDIM inversion of x0 (in [-1, 1]): at index k with abar_k, the clean
        image predicted from the model's output (clipped to [-1, 1] if `clip_denoised`), eps re-derived from it, and
        x_{k+1} = x0_hat sqrt(abar_{k+1}) + sqrt(1 - abar_{k+1}) eps (abar_S = 0)."""
        x = x0.to(self.state_dtype)
        for k in range(self.steps):
            a = float(self.alphas_cumprod[k])
            a_next = float(self.alphas_cumprod[k + 1]) if k + 1 < self.steps else 0.0
            recip, recipm1 = (1.0 / a) ** 0.5, (1.0 / a - 1.0) ** 0.5
            x0_hat = recip * x - recipm1 * self.eps(x, k)
            if self.clip_denoised:
                x0_hat = x0_hat.clamp(-1, 1)
            eps = (recip * x - x0_hat) / recipm1
            yield eps
            x = x0_hat * a_next**0.5 + (1.0 - a_next) ** 0.5 * eps

    def statistics(self, x0: torch.Tensor) -> np.ndarray:
        """float64 [B, 12] path statistics of images x0 in [-1, 1] (`STATISTICS` order), accumulated step by step:
        sums over steps and pixels of eps^p and |eps|, and of deps/dt = diff(eps) * S, with the square root of the
        squared sum and the real cube root of the cubed sum."""
        sums = torch.zeros(len(x0), 8, dtype=torch.float64, device=x0.device)
        previous = None
        for eps in self.path_eps(x0):
            eps = eps.double().flatten(1)
            sums[:, :4] += _power_sums(eps)
            if previous is not None:
                sums[:, 4:] += _power_sums((eps - previous) * self.steps)
            previous = eps
        s = sums.cpu().numpy()
        out = []
        for first in (0, 4):
            total, absolute, square, cube = s[:, first:first + 4].T
            out += [total, absolute, square, np.sqrt(square), cube, np.cbrt(cube)]
        return np.stack(out, axis=1)


def _power_sums(v: torch.Tensor) -> torch.Tensor:
    """[B, 4]: per row sum v, sum |v|, sum v^2, sum v^3."""
    return torch.stack([v.sum(1), v.abs().sum(1), (v * v).sum(1), (v * v * v).sum(1)], dim=1)


def to_model_input(images: Sequence[Any], size: int) -> torch.Tensor:
    """The official pixels: torchvision Resize((size, size)) (bilinear, on PIL images) + ToTensor + Normalize(0.5,
    0.5): float32 [B,3,size,size] in [-1, 1]."""
    arrays = []
    for img in images:
        img = img.convert("RGB")
        if img.size != (size, size):
            img = img.resize((size, size), resample=2)  # PIL bilinear, as torchvision on PIL images
        arrays.append(np.asarray(img, dtype=np.float32) / 255.0)
    if not arrays:
        return torch.zeros(0, 3, size, size)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous() * 2 - 1


# -- density models -------------------------------------------------------------------------------------------
def fit_kde(train: np.ndarray, bandwidth: float):
    """eval_1d.py:29: a Gaussian KernelDensity on the [N, 1] training statistic."""
    from sklearn.neighbors import KernelDensity

    return KernelDensity(kernel="gaussian", bandwidth=bandwidth).fit(train)


def gmm_pipeline(n_components: int = 1, covariance_type: str = "full", max_iter: int = 200, seed: int = 0):
    """eval_6d.py:43-46: StandardScaler then GaussianMixture (seeded here; the official is unseeded)."""
    from sklearn.mixture import GaussianMixture
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    return Pipeline([("scaler", StandardScaler()),
                     ("GMM", GaussianMixture(n_components=n_components, covariance_type=covariance_type,
                                             max_iter=max_iter, random_state=seed))])


def select_gmm(train: np.ndarray, components: Sequence[int], covariance_types: Sequence[str], max_iter: int,
               folds: int, seed: int, n_jobs: int | None = None) -> tuple[int, str]:
    """eval_6d.py:38-50: GridSearchCV over components x covariance types by the mean held-out log-likelihood
    (`folds`-fold, unshuffled), first best kept. Returns (n_components, covariance_type)."""
    from sklearn.model_selection import GridSearchCV

    grid = {"GMM__n_components": list(components), "GMM__covariance_type": list(covariance_types),
            "GMM__max_iter": [max_iter]}
    search = GridSearchCV(gmm_pipeline(seed=seed), grid, cv=folds, n_jobs=n_jobs, refit=False).fit(train)
    best = search.best_params_
    log.info("DiffPath-6D mixture: %s (mean held-out log-likelihood %.4g)", best, search.best_score_)
    return int(best["GMM__n_components"]), str(best["GMM__covariance_type"])


@register_detector("diffpath")
class DiffPath(Detector):
    """DiffPath-6D (default) or -1D with one unconditional improved-diffusion / ADM UNet. A loaded `unet`
    (`UNet2DModel`) may be passed instead of `unet_id`; `fit` reads the ID training images."""

    label = "DiffPath"
    family = "generative"
    inputs = frozenset({"images"})
    paper = ("Heng, Thiery & Soh, Out-of-Distribution Detection with a Single Unconditional Diffusion Model, "
             "NeurIPS 2024")
    reference_code = "clear-nus/diffpath (6f92000) save_train_statistics.py, eval_6d.py, eval_1d.py"
    aliases = {"DiffPath-6D": "the paper's"}

    @dataclass(frozen=True)
    class Params(Params):
        variant: Literal["6d", "1d"] = param("6d", "DiffPath-6D (mixture on six statistics) or -1D (KDE on one)")
        unet_id: str | None = param(None, f"improved-diffusion / ADM checkpoint file ({DEFAULT_CHECKPOINT}, the "
                                          "official default) or diffusers folder")
        adm_flags: dict | None = param(None, "the checkpoint's model flags (None: the ImageNet 64x64 model's)")
        steps: int = param(10, "DDIM steps of the path", ge=2)
        clip_denoised: bool = param(True, "clip the predicted clean image to [-1, 1]")
        kde_bandwidth: float = param(5.0, "DiffPath-1D Gaussian KDE bandwidth", gt=0)
        gmm_components: list[int] = param([50, 100], "DiffPath-6D mixture sizes searched")
        gmm_covariance_types: list[str] = param(list(COVARIANCE_TYPES), "DiffPath-6D covariance types searched")
        gmm_max_iter: int = param(200, "EM iterations of each mixture", ge=1)
        cv_folds: int = param(10, "cross-validation folds of the mixture search", ge=2)
        seed: int = param(0, "seed of the mixtures' k-means initialisation")
        batch_size: int = param(256, "images per batch", runtime=True, ge=1)
        n_jobs: int | None = param(5, "parallel mixture fits in the search", runtime=True)
        precision: str = param("auto", "model precision (auto: fp16 on GPU, as ADM's use_fp16; fp32 on CPU)",
                               runtime=True)
        device: str | None = param(None, "torch device (None: the process's accelerator)", runtime=True)

    needs = frozenset({"precision", "device"})

    def __init__(self, unet: Any = None, **params: Any) -> None:
        super().__init__(**params)
        unknown = sorted(set(self.params["gmm_covariance_types"]) - set(COVARIANCE_TYPES))
        if unknown:
            raise ValueError(f"diffpath: gmm_covariance_types {unknown} not among {COVARIANCE_TYPES}")
        self._unet = unet
        self._path: DDIMPath | None = None
        self._train: np.ndarray | None = None
        self._choice: tuple[int, str] | None = None
        self._density: Any = None

    @classmethod
    def check_files(cls, params: dict[str, Any]) -> None:
        """The plan's check: `unet_id` is given and, a checkpoint file, exists (a folder or hub id is left to the
        loader)."""
        unet = params.get("unet_id")
        if unet is None:
            raise ValueError(f"unet_id: none given; diffpath needs the official model {DEFAULT_CHECKPOINT} "
                             f"({CHECKPOINT_URL})")
        if Path(str(unet)).suffix in CHECKPOINT_SUFFIXES and not Path(str(unet)).is_file():
            raise ValueError(f"unet_id: {unet} does not exist (the official model: {CHECKPOINT_URL})")

    def batch_identity(self) -> dict[str, Any]:
        from pipelines.fingerprint import source_identity, weights_fingerprint

        given = [weights_fingerprint(self._unet)] if hasattr(self._unet, "state_dict") else []
        return {**super().batch_identity(), "unet": source_identity(self.params["unet_id"]), "given": given}

    # -- model ----------------------------------------------------------------------------------------------
    @property
    def flags(self) -> dict[str, Any]:
        return dict(IMPROVED_64_UNCOND if self.params["adm_flags"] is None else self.params["adm_flags"])

    @property
    def torch_device(self) -> torch.device:
        if self._unet is not None and self.params["device"] is None:
            return next(self._unet.parameters()).device
        return resolve_device(self.params["device"])

    @property
    def dtype(self) -> torch.dtype:
        if self.params["precision"] == "auto" and self.torch_device.type == "cuda":
            return torch.float16
        return resolve_dtype(self.params["precision"], self.torch_device)

    def path(self) -> DDIMPath:
        """The UNet on its device with the respaced schedule (loaded from `unet_id` unless a `unet` was given)."""
        if self._path is None:
            unet = self._unet
            if unet is None:
                if self.params["unet_id"] is None:
                    raise ValueError(f"diffpath needs unet= (a UNet2DModel) or unet_id= (the official model "
                                     f"{DEFAULT_CHECKPOINT}: {CHECKPOINT_URL})")
                from detectors.generative.guided_diffusion import load_pixel_unet

                unet = load_pixel_unet(self.params["unet_id"], self.flags, self.dtype)
            unet = unet.to(self.torch_device).eval().requires_grad_(False)
            if unet.dtype != self.dtype:
                unet = unet.to(self.dtype)
            enable_attention(unet)
            flags = self.flags
            self._path = DDIMPath.build(unet, self.params["steps"], int(flags.get("diffusion_steps", 1000)),
                                        str(flags.get("noise_schedule", "linear")), self.params["clip_denoised"],
                                        self.dtype)
        return self._path

    def statistics(self, images: ImageSet) -> np.ndarray:
        """float64 [N, 12] path statistics (`STATISTICS`) of the images, in batches of `batch_size`."""
        if not isinstance(images, ImageSet):
            raise TypeError(f"diffpath reads an ImageSet, got {type(images).__name__}")
        if len(images) == 0:
            return np.zeros((0, len(STATISTICS)))
        path = self.path()
        size = int(path.unet.config.sample_size)
        out = []
        total = -(-len(images) // self.params["batch_size"])
        for _, batch in progress_bar(images.batches(self.params["batch_size"]), "diffpath", total=total, unit="batch",
                                     leave=False):
            out.append(path.statistics(to_model_input(batch, size).to(self.torch_device)))
        return np.concatenate(out)

    def features(self, statistics: np.ndarray) -> np.ndarray:
        """The variant's columns of [N, 12] statistics."""
        return statistics[:, [STATISTICS.index(s) for s in VARIANTS[self.params["variant"]]]]

    # -- density --------------------------------------------------------------------------------------------
    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        train = self.features(self.statistics(id_train))
        if len(train) == 0:
            raise ValueError("diffpath needs ID training images to fit its density model")
        self._choice = None
        p = self.params
        if p["variant"] == "6d":
            self._choice = select_gmm(train, p["gmm_components"], p["gmm_covariance_types"], p["gmm_max_iter"],
                                      p["cv_folds"], p["seed"], p["n_jobs"])
        self._set_density(train)

    def _set_density(self, train: np.ndarray) -> None:
        self._train = train
        if self.params["variant"] == "1d":
            self._density = fit_kde(train, self.params["kde_bandwidth"])
        else:
            n_components, covariance_type = self._choice
            self._density = gmm_pipeline(n_components, covariance_type, self.params["gmm_max_iter"],
                                         self.params["seed"]).fit(train)

    def score_statistics(self, statistics: np.ndarray) -> np.ndarray:
        """Log-density of [N, 12] statistics under the fitted model (higher = ID)."""
        if self._density is None:
            raise RuntimeError("diffpath is not fitted: call fit(id_train) first")
        if len(statistics) == 0:
            return np.zeros(0)
        return np.asarray(self._density.score_samples(self.features(statistics)), dtype=np.float64)

    def _score(self, batch: Any) -> np.ndarray:
        if self._density is None:
            raise RuntimeError("diffpath is not fitted: call fit(id_train) first")
        return self.score_statistics(self.statistics(batch))

    def resolved_params(self) -> dict[str, Any]:
        """The mixture the search chose (DiffPath-6D), as the one-point grid that reproduces it."""
        if self._choice is None:
            return {}
        return {"gmm_components": [self._choice[0]], "gmm_covariance_types": [self._choice[1]]}

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self._train is not None:
            out["train_features"] = self._train
        if self._choice is not None:
            out["gmm_choice"] = np.array([self._choice[0], COVARIANCE_TYPES.index(self._choice[1])], dtype=np.int64)
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Refit the density on the saved training features (the mixture with the saved choice and seed)."""
        super().load_state(state)
        if "train_features" in state:
            choice = state.get("gmm_choice")
            self._choice = None if choice is None else (int(choice[0]), COVARIANCE_TYPES[int(choice[1])])
            self._set_density(np.asarray(state["train_features"], dtype=np.float64))
            self.fitted = True
