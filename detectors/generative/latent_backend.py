"""DIFFGUARD's latent back-end, our Stable Diffusion variant of the paper's class-conditional LDM.

The predicted class name is the text ("a photo of a {class}"); the null text "" plays the null class. The image's VAE
latent is DDIM-inverted with the null text over the full schedule (`DDIMInverseScheduler`), then denoised with
classifier-free guidance applied only inside the Grad-CAM mask of the predicted class (elsewhere the null-text noise
prediction is kept), as DIFFGUARD's `activation_map` sampler does. The same timesteps are used both ways.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelines.progress import progress as progress_bar


@dataclass
class LatentDiffusion:
    """A diffusers `StableDiffusionPipeline`'s components on one device and dtype."""

    pipe: object
    steps: int = 25
    dtype: torch.dtype = torch.float32

    @property
    def device(self) -> torch.device:
        return self.pipe.unet.device

    @property
    def resolution(self) -> int:
        return int(self.pipe.unet.config.sample_size) * int(self.pipe.vae_scale_factor)

    @torch.no_grad()
    def encode_text(self, prompts: list[str]) -> torch.Tensor:
        """Text-encoder hidden states [N,77,D] for `prompts`."""
        tok = self.pipe.tokenizer(prompts, padding="max_length", max_length=self.pipe.tokenizer.model_max_length,
                                  truncation=True, return_tensors="pt")
        return self.pipe.text_encoder(tok.input_ids.to(self.device))[0].to(self.dtype)

    @torch.no_grad()
    def encode_image(self, x01: torch.Tensor) -> torch.Tensor:
        """VAE posterior means of images in [0,1], scaled to the UNet's latent space."""
        dist = self.pipe.vae.encode((2 * x01 - 1).to(self.device, self.dtype)).latent_dist
        return dist.mean * self.pipe.vae.config.scaling_factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images in [0,1] (float32) from latents."""
        image = self.pipe.vae.decode(latents.to(self.dtype) / self.pipe.vae.config.scaling_factor).sample
        return ((image.float() + 1) / 2).clamp(0, 1)

    def _unet(self, z: torch.Tensor, t: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.pipe.unet(z.to(self.dtype), t, encoder_hidden_states=text).sample.float()

    @torch.no_grad()
    def invert(self, z0: torch.Tensor, null: torch.Tensor, progress: bool = False) -> torch.Tensor:
        """Full DDIM inversion of latents with the null text [1,77,D]."""
        from diffusers import DDIMInverseScheduler

        inverse = DDIMInverseScheduler.from_config(self.pipe.scheduler.config)
        inverse.set_timesteps(self.steps, device=self.device)
        z = z0.float()
        text = null.expand(len(z), -1, -1)
        for t in progress_bar(inverse.timesteps, desc="diffguard latent inversion", leave=False, disable=not progress):
            z = inverse.step(self._unet(z, t, text), t, z).prev_sample
        return z

    @torch.no_grad()
    def denoise_masked_cfg(self, zT: torch.Tensor, null: torch.Tensor, cond: torch.Tensor, mask: torch.Tensor,
                           scale: float, progress: bool = False) -> torch.Tensor:
        """DDIM from zT with eps = eps_null + scale * (eps_cond - eps_null) where `mask` [B,1,H,W] (image size, 0/1)
        is set, eps_null elsewhere."""
        from diffusers import DDIMScheduler

        scheduler = DDIMScheduler.from_config(self.pipe.scheduler.config)
        scheduler.set_timesteps(self.steps, device=self.device)
        inside = F.interpolate(mask.float().to(self.device), size=zT.shape[-2:], mode="nearest") > 0.5
        z = zT.float()
        text = torch.cat([null.expand(len(z), -1, -1), cond])
        for t in progress_bar(scheduler.timesteps, desc="diffguard latent denoising", leave=False,
                              disable=not progress):
            eps_null, eps_cond = self._unet(torch.cat([z, z]), t, text).chunk(2)
            eps = torch.where(inside, eps_null + scale * (eps_cond - eps_null), eps_null)
            z = scheduler.step(eps, t, z, eta=0.0).prev_sample
        return z
