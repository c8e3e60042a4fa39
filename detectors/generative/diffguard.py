"""DIFFGUARD (Gao et al., ICCV 2023): regenerate the image conditioned on itself and on the predicted label; OOD images
drift toward the label's semantics. Score = similarity of the two images (higher = ID).

Two back-ends behind one detector (`backend=`):
- "pixel" (the paper's default, guided-diffusion): an unconditional `UNet2DModel` (ADM), respaced DDIM (eta 0), DDIM
  inversion with per-sample adaptive early stop (batched, see pixel_backend), denoising from one step noisier than the
  stop, classifier guidance by the protected classifier ("clean grad" blend, random crops); the unguided
  reconstruction from the same latent is the reference.
- "latent": our Stable Diffusion variant of the paper's class-conditional LDM (latent_backend); the reference is the
  input image itself.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from detectors.base import Detector, ImageSet
from detectors.generative.distances import SIMILARITIES, build_similarity, psnr
from detectors.generative.gradcam import grad_cam, last_spatial_block
from detectors.generative.latent_backend import LatentDiffusion
from detectors.generative.pixel_backend import ClassifierGuidance, PixelDiffusion, denoise_from, invert_with_early_stop
from detectors.registry import register_detector
from pipelines.runtime import diffusers_dtype, enable_attention, item_generator, item_seed, load_pretrained, resolve_dtype

DEFAULT_SD_ID = "stable-diffusion-v1-5/stable-diffusion-v1-5"


def images_to_tensor(images: list[Any], size: int) -> torch.Tensor:
    """PIL images -> center square crop -> bicubic resize to size x size -> float32 [B,3,size,size] in [0,1]."""
    arrays = []
    for img in images:
        img = img.convert("RGB")
        side = min(img.size)
        left, top = (img.width - side) // 2, (img.height - side) // 2
        img = img.crop((left, top, left + side, top + side)).resize((size, size), resample=3)
        arrays.append(np.asarray(img, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


@register_detector("diffguard")
class DiffGuard(Detector):
    """DIFFGUARD with a pixel (ADM) or latent (Stable Diffusion) back-end; needs the protected classifier.

    Models stay outside `params`: `classifier` (pipelines.classifier.ImageClassifier interface: `forward_images`,
    `.image_size`), and optionally a loaded `unet` (pixel) or `pipeline` (latent) instead of `unet_id` / `sd_id`.
    """

    family = "generative"
    inputs = frozenset({"images"})
    paper = "Gao et al., DIFFGUARD: Semantic Mismatch-Guided Out-of-Distribution Detection using Pre-trained Diffusion Models, ICCV 2023"
    defaults: ClassVar[dict[str, Any]] = {
        "backend": "pixel",
        "distance": "dists",
        "perceptual_weights": None,
        "batch_size": 8,
        "precision": "auto",
        "seed": 0,
        # pixel back-end (guided-diffusion 256x256 uncond, DIFFGUARD exp6.1)
        "unet_id": None,
        "num_train_timesteps": 1000,
        "beta_start": 1e-4,
        "beta_end": 0.02,
        "steps": 100,
        "max_inversion_steps": 90,
        "early_stop_psnr": 6.39,
        "early_stop_similarity": "dists",
        "early_stop_similarity_threshold": 0.38,
        "denoise_offset": 1,
        "guidance_scale": 3.0,
        "n_crops": 8,
        "crop_min_fraction": 224 / 256,
        "clean_grad": True,
        "guidance_grad": "blend",
        "clip_denoised": True,
        # latent back-end (our Stable Diffusion variant)
        "sd_id": DEFAULT_SD_ID,
        "latent_steps": 25,
        "cfg_scale": 10.0,
        "cam_threshold": 0.3,
        "gradcam_layer": None,
        "prompt_template": "a photo of a {}",
        "class_names": None,
    }

    def __init__(self, classifier: Any = None, unet: Any = None, pipeline: Any = None, **params: Any) -> None:
        super().__init__(**params)
        if self.backend not in ("pixel", "latent"):
            raise ValueError(f"diffguard: backend must be 'pixel' or 'latent', got {self.backend!r}")
        for key in ("distance", "early_stop_similarity"):
            value = self.params[key]
            if value is not None and value not in SIMILARITIES:
                raise ValueError(f"diffguard: {key} must be one of {SIMILARITIES}, got {value!r}")
        self.classifier, self._unet, self._pipeline = classifier, unet, pipeline
        self._pixel: PixelDiffusion | None = None
        self._latent: LatentDiffusion | None = None
        self._similarities: dict[str, Any] = {}

    # -- models ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        if self.classifier is None:
            raise ValueError("diffguard needs the protected classifier: build('diffguard', classifier=ImageClassifier)")
        return next(self.classifier.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return resolve_dtype(self.precision, self.device)

    def pixel_model(self) -> PixelDiffusion:
        """The pixel UNet on the classifier's device (loaded from `unet_id` unless a `unet` was given)."""
        if self._pixel is None:
            unet = self._unet
            if unet is None:
                if self.unet_id is None:
                    raise ValueError("diffguard backend 'pixel' needs unet= (a UNet2DModel) or unet_id= (hub id or folder)")
                from diffusers import UNet2DModel

                unet = load_pretrained(UNet2DModel.from_pretrained, self.unet_id, "DIFFGUARD pixel UNet")
            unet = unet.to(self.device).eval().requires_grad_(False)
            if unet.dtype != self.dtype:
                unet = unet.to(self.dtype)
            enable_attention(unet)
            self._pixel = PixelDiffusion.build(unet, self.steps, self.num_train_timesteps, self.beta_start, self.beta_end,
                                               self.clip_denoised, self.dtype)
        return self._pixel

    def latent_model(self) -> LatentDiffusion:
        """The Stable Diffusion components on the classifier's device (loaded from `sd_id` unless `pipeline` given)."""
        if self._latent is None:
            pipe = self._pipeline
            if pipe is None:
                from diffusers import StableDiffusionPipeline

                pipe = load_pretrained(StableDiffusionPipeline.from_pretrained, self.sd_id, "DIFFGUARD Stable Diffusion",
                                       **diffusers_dtype(self.dtype), safety_checker=None, requires_safety_checker=False)
            pipe = pipe.to(self.device)
            if pipe.unet.dtype != self.dtype:
                pipe = pipe.to(dtype=self.dtype)
            for part in (pipe.unet, pipe.vae, pipe.text_encoder):
                part.eval().requires_grad_(False)
            enable_attention(pipe)
            self._latent = LatentDiffusion(pipe, self.latent_steps, self.dtype)
        return self._latent

    def similarity(self, name: str):
        """The (cached) similarity function `name`, higher = more similar, on images in [0,1]."""
        if name not in self._similarities:
            self._similarities[name] = build_similarity(name, classifier=self.classifier, weights=self.perceptual_weights,
                                                        device=self.device)
        return self._similarities[name]

    def class_name(self, label: int) -> str:
        names = self.class_names
        if names is None:
            config = getattr(getattr(self.classifier, "model", None), "config", None)
            names = getattr(config, "id2label", None)
        if names is None:
            raise ValueError("diffguard backend 'latent' needs class names: pass class_names=[...] (index -> name)")
        return str(names[label] if not isinstance(names, dict) else names.get(label, names.get(str(label))))

    # -- scoring --------------------------------------------------------------------------------------------
    def logits(self, x01: torch.Tensor) -> torch.Tensor:
        """The classifier's logits for images in [0,1] (cast to the classifier's dtype)."""
        return self.classifier.forward_images(x01.to(self.classifier.head.weight.dtype))[0]

    def predict(self, x01: torch.Tensor) -> torch.Tensor:
        """The classifier's predicted labels [B] for images in [0,1]."""
        with torch.no_grad():
            return self.logits(x01).argmax(1)

    def stop_rule(self):
        """Early stop of inversion: PSNR(x_t, x_0) < early_stop_psnr or similarity < its threshold (None disables)."""
        similarity = self.similarity(self.early_stop_similarity) if self.early_stop_similarity else None
        if self.early_stop_psnr is None and similarity is None:
            return None

        def rule(x_t: torch.Tensor, x_0: torch.Tensor) -> torch.Tensor:
            a, b = (x_t + 1) / 2, (x_0 + 1) / 2
            stop = torch.zeros(len(a), dtype=torch.bool, device=a.device)
            if self.early_stop_psnr is not None:
                stop |= psnr(a, b) < self.early_stop_psnr
            if similarity is not None:
                stop |= similarity(a, b).to(a.device) < self.early_stop_similarity_threshold
            return stop

        return rule

    def reconstruct_pixel(self, x01: torch.Tensor, labels: torch.Tensor, seeds: list[int],
                          progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(guided, unguided reconstructions in [0,1], inversion stop steps) for images x01 and target labels."""
        model = self.pixel_model()
        x0 = (2 * x01 - 1).to(self.device)
        latents, stop = invert_with_early_stop(model, x0, self.max_inversion_steps, self.stop_rule(), progress)
        start = (stop + 1 + self.denoise_offset).clamp(max=model.steps - 1)
        n = len(x0)
        gens = [item_generator(s) for s in seeds]
        guidance = ClassifierGuidance(model, self.classifier, labels.repeat(2), gens + gens, self.guidance_scale, self.n_crops,
                                      self.crop_min_fraction, self.clean_grad, self.guidance_grad)
        guided = torch.arange(2 * n, device=x0.device) < n
        out = denoise_from(model, torch.cat([latents, latents]), torch.cat([start, start]), guidance, guided, progress)
        out = ((out.clamp(-1, 1) + 1) / 2).detach()
        return out[:n], out[n:], stop

    def reconstruct_latent(self, x01: torch.Tensor, labels: torch.Tensor, progress: bool = False) -> torch.Tensor:
        """Masked-CFG reconstruction in [0,1] of images x01 at the pipeline's resolution."""
        model = self.latent_model()
        layer_name = self.gradcam_layer or last_spatial_block(self.classifier, lambda: self.logits(x01[:1]))
        cam = grad_cam(self.logits, self.classifier.get_submodule(layer_name), x01, labels)
        mask = (cam > self.cam_threshold).unsqueeze(1)
        null = model.encode_text([""])
        cond = model.encode_text([self.prompt_template.format(self.class_name(int(y))) for y in labels.tolist()])
        zT = model.invert(model.encode_image(x01), null, progress)
        return model.decode(model.denoise_masked_cfg(zT, null, cond, mask, self.cfg_scale, progress))

    def _score(self, batch: ImageSet) -> np.ndarray:
        if not isinstance(batch, ImageSet):
            raise TypeError(f"diffguard scores an ImageSet, got {type(batch).__name__}")
        size = self.pixel_model().unet.config.sample_size if self.backend == "pixel" else self.latent_model().resolution
        distance = self.similarity(self.distance)
        scores = []
        total = -(-len(batch) // self.batch_size)
        for start, images in tqdm(batch.batches(self.batch_size), total=total, desc=f"diffguard ({self.backend})", leave=False):
            x01 = images_to_tensor(images, int(size)).to(self.device)
            labels = self.predict(x01)
            if self.backend == "pixel":
                seeds = [item_seed(self.seed, key) for key in batch.keys[start:start + len(images)]]
                guided, reference, _ = self.reconstruct_pixel(x01, labels, seeds)
            else:
                guided, reference = self.reconstruct_latent(x01, labels), x01
            scores.append(distance(guided, reference).cpu().numpy())
        return np.concatenate(scores).astype(np.float64)
