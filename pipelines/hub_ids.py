"""The default hub model ids, declared once: every default of the pipelines, detectors, generation jobs and stand-ins
reads its id from here (configs may name any other hub id or a local folder)."""
from __future__ import annotations

SDXL_ID = "stabilityai/stable-diffusion-xl-base-1.0"  # ZeST base
CONTROLNET_ID = "diffusers/controlnet-depth-sdxl-1.0"  # ZeST depth ControlNet
IP_ADAPTER_ID = "h94/IP-Adapter"  # ZeST material encoder (ViT-H image encoder + SDXL adapter weights)
IMAGE_ENCODER_FILE = "models/image_encoder/config.json"  # the image encoder's config inside IP_ADAPTER_ID
DPT_ID = "Intel/dpt-hybrid-midas"  # depth for ZeST's ControlNet
SDXL_VAE_FP16_ID = "madebyollin/sdxl-vae-fp16-fix"  # SDXL VAE that runs in fp16
CLIP_ID = "openai/clip-vit-base-patch16"  # CLIP detectors' backbone
SD15_ID = "stable-diffusion-v1-5/stable-diffusion-v1-5"  # DIFFGUARD's latent backend
SD21_ID = "stabilityai/stable-diffusion-2-1-base"
RESNET_ID = "microsoft/resnet-50"  # the ImageNet classifier
