"""DIFFGUARD (Gao et al., ICCV 2023): regenerate the image conditioned on itself and on the predicted label; OOD images
drift toward the label's semantics. Score = similarity of the two images (higher = ID).

Two back-ends behind one detector (`backend=`):
- "pixel" (the paper's default, guided-diffusion): an unconditional `UNet2DModel` (ADM; an OpenAI checkpoint file is
  converted by detectors.generative.guided_diffusion), respaced DDIM (eta 0), DDIM inversion with per-sample adaptive
  early stop (batched, see pixel_backend), denoising from one step noisier than the stop, classifier guidance by the
  protected classifier ("clean grad" blend, random crops); reference: the unguided reconstruction from the same latent.
- "latent": our Stable Diffusion variant of the paper's class-conditional LDM (latent_backend); reference: the input.

Preprocessing follows DIFFGUARD's code (cure-lab/DiffGuard, exp6.1 / ldm-exp2.25): pixel: the classifier sees
Resize(256) + CenterCrop(224) (torchvision semantics, bilinear), the diffusion model that crop bilinearly resized to
its 256 px, reconstructions are resized back to 224 and compared there; latent: one Resize + CenterCrop to the
diffusion resolution for everything.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from detectors.base import Detector, ImageSet
from detectors.generative.diffguard_inputs import check_model_files
from detectors.generative.distances import against, build_similarity, psnr
from detectors.generative.gradcam import last_spatial_block, logits_and_cam
from detectors.generative.latent_backend import LatentDiffusion
from detectors.generative.pixel_backend import ClassifierGuidance, PixelDiffusion, denoise_from, invert_with_early_stop
from detectors.registry import register_detector
from pipelines.hub_ids import SD15_ID
from pipelines.params import Params, param
from pipelines.progress import progress as progress_bar
from pipelines.runtime import (
    diffusers_dtype,
    enable_attention,
    item_generator,
    item_seed,
    load_pretrained,
    resolve_dtype,
)

DEFAULT_SD_ID = SD15_ID
Similarity = Literal["dists", "lpips", "logit_l1", "ssim", "psnr", "l2"]  # distances.SIMILARITIES


def resize_center_crop(images: Sequence[Any], resize: int, crop: int) -> torch.Tensor:
    """torchvision's Resize(resize) + CenterCrop(crop) + ToTensor on PIL images: the short side bilinearly (PIL) to
    `resize`, the long side to int(resize * long / short), then the central crop x crop window (offsets
    int(round((side - crop) / 2))). Returns float32 [B,3,crop,crop] in [0,1]."""
    if crop > resize:
        raise ValueError(f"center crop {crop} is larger than the resized short side {resize}")
    arrays = []
    for img in images:
        img = img.convert("RGB")
        w, h = img.size
        size = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
        if size != (w, h):
            img = img.resize(size, resample=2)  # PIL bilinear (antialiased), as torchvision on PIL images
        left, top = int(round((size[0] - crop) / 2.0)), int(round((size[1] - crop) / 2.0))
        img = img.crop((left, top, left + crop, top + crop))
        arrays.append(np.asarray(img, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()


def resize_square(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize of square images to size x size (torchvision's tensor Resize of DIFFGUARD's time: no
    antialiasing); identity when already that size."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


@register_detector("diffguard")
class DiffGuard(Detector):
    """DIFFGUARD with a pixel (ADM) or latent (Stable Diffusion) back-end; needs the protected classifier.

    Models stay outside `params`: `classifier` (pipelines.classifier.ImageClassifier interface: `forward_images`,
    `.image_size`), and optionally a loaded `unet` (pixel) or `pipeline` (latent) instead of `unet_id` / `sd_id`.
    """

    label = "DIFFGUARD"
    family = "generative"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = ("Gao et al., DIFFGUARD: Semantic Mismatch-Guided Out-of-Distribution Detection using Pre-trained "
             "Diffusion Models, ICCV 2023")

    @dataclass(frozen=True)
    class Params(Params):
        backend: Literal["pixel", "latent"] = param("pixel",
                                                    "ADM pixel diffusion (the paper's) or Stable Diffusion latents")
        distance: Similarity = param("dists", "image similarity scored between input and guided reconstruction")
        reference: Literal["auto", "input", "unguided"] = param("auto",
                                                                "what the guided reconstruction is compared with")
        perceptual_weights: str | os.PathLike | Sequence[str | os.PathLike] | None = param(
            None, "DISTS / LPIPS weights: a file or folder, or the list of files")
        batch_size: int = param(8, "images per batch", runtime=True, ge=1)
        precision: str = param("auto", "compute precision (auto: the runtime's)", runtime=True)
        seed: int = param(100, "seed of the noise and crops")
        crop_seeds: Literal["shared", "per_image"] = param("shared", "one crop draw for all images or one per image")
        resize_size: int | None = param(None, "resize before the centre crop (None: crop * 256 / 224)", ge=1)
        # pixel back-end (guided-diffusion 256x256 uncond, DIFFGUARD exp6.1)
        unet_id: str | None = param(None, "ADM UNet checkpoint or folder")
        adm_flags: dict | None = param(None, "guided-diffusion model flags")
        num_train_timesteps: int = param(1000, "diffusion training timesteps", ge=1)
        beta_start: float = param(1e-4, "linear beta schedule start", gt=0)
        beta_end: float = param(0.02, "linear beta schedule end", gt=0)
        steps: int = param(100, "DDIM steps", ge=1)
        max_inversion_steps: int = param(90, "most DDIM inversion steps", ge=1)
        early_stop_psnr: float | None = param(6.39,
                                              "inversion stops when PSNR to the input falls below this (None: off)")
        early_stop_similarity: Similarity | None = param("dists", "similarity of the early stop")
        early_stop_similarity_threshold: float | None = param(0.38, "threshold of the early-stop similarity")
        denoise_offset: int = param(1, "steps between inversion end and guided denoising start", ge=0)
        guidance_scale: float = param(3.0, "classifier-guidance scale", ge=0)
        n_crops: int = param(8, "random crops averaged in the guidance", ge=1)
        crop_size: int | None = param(None, "guidance crop size (None: the classifier's input size)", ge=1)
        clean_grad: bool = param(True, "guidance gradient through the predicted clean image")
        guidance_grad: Literal["blend", "x_t"] = param("blend", "differentiate w.r.t. the blend (official) or x_t")
        clip_denoised: bool = param(True, "clip predicted clean images to [-1, 1]")
        # latent back-end (our Stable Diffusion variant)
        sd_id: str = param(DEFAULT_SD_ID, "Stable Diffusion hub id or folder")
        latent_steps: int = param(25, "latent DDIM steps", ge=1)
        cfg_scale: float = param(10.0, "classifier-free guidance scale", ge=0)
        cam_threshold: float = param(0.3, "Grad-CAM mask threshold (above 1: no mask)", ge=0)
        gradcam_layer: str | None = param(None, "Grad-CAM layer (None: the last spatial block)")
        prompt_template: str = param("a photo of a {}", "class prompt of the latent back-end")
        class_names: list[str] | None = param(None, "ID class names for the prompts (saved)")

    needs = frozenset({"classifier", "class_names", "precision"})

    def __init__(self, classifier: Any = None, unet: Any = None, pipeline: Any = None, **params: Any) -> None:
        super().__init__(**params)
        self.classifier, self._unet, self._pipeline = classifier, unet, pipeline
        self._pixel: PixelDiffusion | None = None
        self._latent: LatentDiffusion | None = None
        self._similarities: dict[str, Any] = {}
        self._cam_layer: str | None = self.params["gradcam_layer"]

    def batch_identity(self) -> dict[str, Any]:
        """The base identity plus the diffusion and perceptual models' sources (files, sizes, mtimes)."""
        from pipelines.fingerprint import source_identity, weights_fingerprint

        weights = self.params["perceptual_weights"]
        weights = weights if isinstance(weights, (list, tuple)) else [weights]
        given = [self._unet, getattr(self._pipeline, "unet", None)]  # models passed in instead of unet_id / sd_id
        return {**super().batch_identity(), "unet": source_identity(self.params["unet_id"]),
                "sd": source_identity(self.params["sd_id"]),
                "perceptual": [source_identity(w) for w in weights],
                "given": [weights_fingerprint(m) for m in given if hasattr(m, "state_dict")]}

    @classmethod
    def check_files(cls, params: dict[str, Any]) -> None:
        """The model files the parameters name (`check_model_files`): the runner's plan calls this, so absent weights
        fail before any detector runs."""
        check_model_files(cls(**params).params)

    # -- models ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        if self.classifier is None:
            raise ValueError("diffguard needs the protected classifier: build('diffguard', classifier=ImageClassifier)")
        return next(self.classifier.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """`auto`: the pixel back-end runs fp16 on GPU as guided-diffusion's `use_fp16` (bf16 flips early-stop
        decisions), the latent back-end bf16 (else fp16); fp32 on CPU."""
        if self.params["precision"] == "auto" and self.params["backend"] == "pixel" and self.device.type == "cuda":
            return torch.float16
        return resolve_dtype(self.params["precision"], self.device)

    @property
    def reference_image(self) -> str:
        """What the reconstruction is compared with: DIFFGUARD's code compares the pixel back-end with the unguided
        reconstruction (exp6.1, `uncond_aux`) and the latent back-end with the input."""
        if self.params["reference"] != "auto":
            return self.params["reference"]
        return "unguided" if self.params["backend"] == "pixel" else "input"

    def classifier_size(self) -> int:
        height, width = self.classifier.image_size
        if height != width:
            raise ValueError(f"diffguard needs a square classifier input, got {height}x{width}")
        return int(height)

    def pixel_model(self) -> PixelDiffusion:
        """The pixel UNet on the classifier's device (loaded from `unet_id` unless a `unet` was given)."""
        if self._pixel is None:
            unet = self._unet
            if unet is None:
                if self.params["unet_id"] is None:
                    raise ValueError("diffguard backend 'pixel' needs unet= (a UNet2DModel) or unet_id= (an OpenAI "
                                     "guided-diffusion checkpoint file such as 256x256_diffusion_uncond.pt, a "
                                     "diffusers "
                                     "folder or hub id)")
                from detectors.generative.guided_diffusion import load_pixel_unet

                unet = load_pixel_unet(self.params["unet_id"], self.params["adm_flags"], self.dtype)
            unet = unet.to(self.device).eval().requires_grad_(False)
            if unet.dtype != self.dtype:
                unet = unet.to(self.dtype)
            enable_attention(unet)
            p = self.params
            self._pixel = PixelDiffusion.build(unet, p["steps"], p["num_train_timesteps"], p["beta_start"],
                                               p["beta_end"], p["clip_denoised"], self.dtype)
        return self._pixel

    def latent_model(self) -> LatentDiffusion:
        """The Stable Diffusion components on the classifier's device (loaded from `sd_id` unless `pipeline` given)."""
        if self._latent is None:
            pipe = self._pipeline
            if pipe is None:
                from diffusers import StableDiffusionPipeline

                pipe = load_pretrained(StableDiffusionPipeline.from_pretrained, self.params["sd_id"],
                                       "DIFFGUARD Stable Diffusion",
                                       **diffusers_dtype(self.dtype), safety_checker=None,
                                       requires_safety_checker=False)
            pipe = pipe.to(self.device)
            if pipe.unet.dtype != self.dtype:
                pipe = pipe.to(dtype=self.dtype)
            for part in (pipe.unet, pipe.vae, pipe.text_encoder):
                part.eval().requires_grad_(False)
            enable_attention(pipe)
            self._latent = LatentDiffusion(pipe, self.params["latent_steps"], self.dtype)
        return self._latent

    def similarity(self, name: str):
        """The (cached) similarity function `name`, higher = more similar, on images in [0,1]."""
        if name not in self._similarities:
            self._similarities[name] = build_similarity(name, classifier=self.classifier,
                                                        weights=self.params["perceptual_weights"], device=self.device)
        return self._similarities[name]

    def class_name(self, label: int) -> str:
        names = self.params["class_names"]
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

    def stop_rule(self, x0: torch.Tensor):
        """Early stop of the inversion of x0 (in [-1,1]): `rule(x_t, rows)` is PSNR(x_t, x0[rows]) < early_stop_psnr
        or similarity(x_t, x0[rows]) < its threshold; x0's perceptual features are computed once, here. None when
        both are disabled."""
        p = self.params
        similarity = self.similarity(p["early_stop_similarity"]) if p["early_stop_similarity"] else None
        if p["early_stop_psnr"] is None and similarity is None:
            return None
        b = (x0 + 1) / 2
        to_input = against(similarity, b) if similarity is not None else None

        def rule(x_t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            a = (x_t + 1) / 2
            stop = torch.zeros(len(a), dtype=torch.bool, device=a.device)
            if p["early_stop_psnr"] is not None:
                stop |= psnr(a, b[rows]) < p["early_stop_psnr"]
            if to_input is not None:
                stop |= to_input(a, rows).to(a.device) < p["early_stop_similarity_threshold"]
            return stop

        return rule

    def reconstruct_pixel(self, x01: torch.Tensor, labels: torch.Tensor, seeds: list[int], unguided: bool = True,
                          progress: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(guided, unguided reconstructions in [0,1] (None unless `unguided`), inversion stop steps) of images x01
        at the UNet's resolution, guided toward `labels`."""
        model = self.pixel_model()
        x0 = (2 * x01 - 1).to(self.device)
        p = self.params
        latents, stop = invert_with_early_stop(model, x0, p["max_inversion_steps"], self.stop_rule(x0), progress)
        start = (stop + 1 + p["denoise_offset"]).clamp(max=model.steps - 1)
        n = len(x0)
        gens = [item_generator(s) for s in seeds]
        copies = 2 if unguided else 1
        guidance = ClassifierGuidance(model, self.classifier, labels.repeat(copies), gens * copies, p["guidance_scale"],
                                      p["n_crops"], int(p["crop_size"] or self.classifier_size()), p["clean_grad"],
                                      p["guidance_grad"])
        guided = torch.arange(copies * n, device=x0.device) < n
        out = denoise_from(model, latents.repeat(copies, 1, 1, 1), start.repeat(copies), guidance, guided, progress)
        out = ((out.clamp(-1, 1) + 1) / 2).detach()
        return out[:n], (out[n:] if unguided else None), stop

    def pixel_pair(self, x: torch.Tensor, labels: torch.Tensor, seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(guided reconstruction, reference) at the classifier's view `x` [B,3,224,224]: the diffusion model sees x
        resized to its resolution, the reconstructions are resized back."""
        side = int(self.pixel_model().unet.config.sample_size)
        unguided = self.reference_image == "unguided"
        guided, plain, _ = self.reconstruct_pixel(resize_square(x, side), labels, seeds, unguided=unguided)
        size = x.shape[-1]
        return resize_square(guided, size), (resize_square(plain, size) if unguided else x)

    def crop_seed_list(self, keys: Sequence[str]) -> list[int]:
        """Seeds of the guidance crops per image: `shared` = `seed` for every image (DIFFGUARD resets its crop
        generator to the run seed before each image, so all images get the same crop sequence); `per_image` =
        derived from `seed` and the image key. Either way independent of batching and process count."""
        if self.params["crop_seeds"] == "shared":
            return [int(self.params["seed"])] * len(keys)
        return [item_seed(self.params["seed"], key) for key in keys]

    def cam_layer(self, x01: torch.Tensor) -> torch.nn.Module:
        """The classifier block of the Grad-CAM (`gradcam_layer`, else the last block with a spatial output, found
        once)."""
        if self._cam_layer is None:
            self._cam_layer = last_spatial_block(self.classifier, lambda: self.logits(x01[:1]))
        return self.classifier.get_submodule(self._cam_layer)

    def reconstruct_latent(self, x01: torch.Tensor, labels: torch.Tensor | None = None, unguided: bool = False,
                           progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(labels, masked-CFG reconstruction in [0,1], unguided reconstruction or None) of images x01 at the
        pipeline's resolution. `labels` None = the classifier's predictions, taken from the Grad-CAM's own forward
        pass. The unguided reconstruction denoises the same latent with the null text only."""
        model = self.latent_model()
        logits, cam = logits_and_cam(self.logits, self.cam_layer(x01), x01, labels)
        labels = logits.argmax(1) if labels is None else labels
        p = self.params
        mask = (cam > p["cam_threshold"]).unsqueeze(1)
        null = model.encode_text([""])
        cond = model.encode_text([p["prompt_template"].format(self.class_name(int(y))) for y in labels.tolist()])
        zT = model.invert(model.encode_image(x01), null, progress)
        if not unguided:
            return labels, model.decode(model.denoise_masked_cfg(zT, null, cond, mask, p["cfg_scale"], progress)), None
        z = model.denoise_masked_cfg(torch.cat([zT, zT]), null, torch.cat([cond, cond]),
                                     torch.cat([mask, torch.zeros_like(mask)]), p["cfg_scale"], progress)
        images = model.decode(z)
        return labels, images[: len(x01)], images[len(x01):]

    def _score(self, batch: ImageSet) -> np.ndarray:
        if not isinstance(batch, ImageSet):
            raise TypeError(f"diffguard scores an ImageSet, got {type(batch).__name__}")
        p = self.params
        if p["backend"] == "pixel":
            crop = self.classifier_size()
            resize = int(p["resize_size"] or round(crop * 256 / 224))
            self.pixel_model()
        else:
            crop = resize = self.latent_model().resolution
        distance = self.similarity(p["distance"])
        scores = []
        total = -(-len(batch) // p["batch_size"])
        for start, images in progress_bar(batch.batches(p["batch_size"]), f"diffguard ({p['backend']})", total=total,
                                          unit="batch", leave=False):
            x = resize_center_crop(images, resize, crop).to(self.device)
            if p["backend"] == "pixel":
                guided, reference = self.pixel_pair(x, self.predict(x),
                                                    self.crop_seed_list(batch.keys[start:start + len(images)]))
            else:
                _, guided, plain = self.reconstruct_latent(x, unguided=self.reference_image == "unguided")
                reference = plain if plain is not None else x
            scores.append(distance(guided, reference).cpu().numpy())
        return np.concatenate(scores).astype(np.float64)
