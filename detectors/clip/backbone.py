"""A loaded transformers `CLIPModel` with its processor: image tower (global + GL-MCM local embeddings), text tower
(from token ids or from token embeddings, for prompt learning), on one device and dtype policy."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pipelines.hub_ids import CLIP_ID
from pipelines.runtime import load_pretrained, resolve_device

DEFAULT_CLIP = CLIP_ID
DEFAULT_TEMPLATES = ("a photo of a {}.",)
LEGACY_EOS_TOKEN_ID = 2  # what OpenAI's CLIP configs (and copies of them) give as text_config.eos_token_id


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal attention mask [1, 1, L, L]: position i sees positions <= i."""
    mask = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device).triu_(1)
    return mask[None, None]


@dataclass
class ClipBackbone:
    """A frozen CLIPModel, its processor and tokenizer, and the id it was loaded from."""

    model: Any
    processor: Any
    model_id: str

    @classmethod
    def load(cls, model: str | os.PathLike | Any = DEFAULT_CLIP, processor: Any = None,
             device: str | None = None) -> ClipBackbone:
        """From a hub id or local folder (through `load_pretrained`), or an already loaded `CLIPModel`."""
        from transformers import CLIPModel, CLIPProcessor

        if isinstance(model, (str, os.PathLike)):
            model_id = str(model)
            model = load_pretrained(CLIPModel.from_pretrained, model_id, what="CLIP model")
        else:
            model_id = str(getattr(model, "name_or_path", "") or "")
            if not model_id and processor is None:
                raise ValueError("a CLIPModel built in memory has no name_or_path to load its processor from: pass "
                                 "processor=")
            model_id = model_id or f"{type(model).__name__}-{id(model):x}"
        if processor is None:
            processor = load_pretrained(CLIPProcessor.from_pretrained, model_id, what="CLIP processor")
        model = model.to(resolve_device(device)).eval().requires_grad_(False)
        return cls(model=model, processor=processor, model_id=model_id)

    # -- basics ---------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.logit_scale.device

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    @property
    def eos_token_id(self) -> int:
        """The end-of-text id the prompts are pooled at: the tokenizer's, never the text config's.

        OpenAI's CLIP configs say `eos_token_id=2` (id 2 is '#') while the tokenizer's <|endoftext|> is 49407;
        open_clip conversions and the CLIPN converter's folders agree with their tokenizer. Without a tokenizer EOS
        the id is the text config's unless that is OpenAI's legacy 2; then `eot_index` pools at argmax(ids), as
        transformers' CLIPTextTransformer does for that value (EOS is the highest id of CLIP's vocabulary)."""
        tokenizer_eos = getattr(self.tokenizer, "eos_token_id", None)
        if tokenizer_eos is not None:
            return int(tokenizer_eos)
        config_eos = self.model.config.text_config.eos_token_id
        return -1 if config_eos is None or int(config_eos) == LEGACY_EOS_TOKEN_ID else int(config_eos)

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.detach().exp())

    def autocast(self):
        """bf16 autocast on GPU, a no-op on CPU (fp32)."""
        enabled = self.device.type == "cuda"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """PIL images -> pixel values [B,3,H,W] on the model's device."""
        pixels = self.processor(images=list(images), return_tensors="pt")["pixel_values"]
        return pixels.to(self.device, self.model.dtype)

    def tokenize(self, texts: Sequence[str]) -> torch.Tensor:
        """Token ids [T, L] padded to the longest text (causal attention makes padding after EOT irrelevant)."""
        ids = self.tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")["input_ids"]
        return ids.to(self.device)

    def eot_index(self, ids: torch.Tensor) -> torch.Tensor:
        """Position of the first end-of-text token of each row (`eos_token_id`; argmax of the ids when only the
        config's legacy eos id 2 is known)."""
        eos = self.eos_token_id
        if eos < 0:
            return ids.argmax(dim=1)
        hits = ids == eos
        if not bool(hits.any(dim=1).all()):
            raise ValueError(f"a tokenized prompt has no end-of-text token (id {eos}, the tokenizer's eos_token_id): "
                             "check the tokenizer and the prompt length")
        return hits.int().argmax(dim=1)

    # -- image tower ----------------------------------------------------------------------------------------
    def image_embeddings(self, pixel_values: torch.Tensor,
                         local: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Projected global embeddings [B,P] and GL-MCM local (per-patch) embeddings [B,L,P] (None with
        `local=False`), not normalised.

        One pass of the vision tower: the last block runs normally for the CLS token and, for the local features,
        with self-only attention (each token attends only to itself: layer_norm1 -> v_proj -> out_proj, residual,
        then the MLP block), followed by post_layernorm and visual_projection on every patch token.
        """
        vision = self.model.vision_model
        x = vision.pre_layrnorm(vision.embeddings(pixel_values))
        *body, last = vision.encoder.layers
        for layer in body:
            x = layer(x, None)
        out = last(x, None)
        global_ = self.model.visual_projection(vision.post_layernorm(out[:, 0]))
        if not local:
            return global_, None
        attn = last.self_attn
        y = x + attn.out_proj(attn.v_proj(last.layer_norm1(x)))
        y = y + last.mlp(last.layer_norm2(y))
        local = self.model.visual_projection(vision.post_layernorm(y[:, 1:]))
        return global_, local

    # -- text tower -----------------------------------------------------------------------------------------
    def token_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, L, W] (without positions) of token ids."""
        return self.model.text_model.embeddings.token_embedding(ids)

    def text_from_embeddings(self, embeds: torch.Tensor, eot: torch.Tensor, text_model: Any = None,
                             projection: Any = None) -> torch.Tensor:
        """Projected text embeddings [T,P] from token embeddings [T,L,W]: add positions, causal encoder, final layer
        norm, pool at the end-of-text positions `eot` [T], text projection. `text_model`/`projection` default to
        CLIP's own (CLIPN passes its "no" tower)."""
        text_model = text_model if text_model is not None else self.model.text_model
        projection = projection if projection is not None else self.model.text_projection
        length = embeds.shape[1]
        x = embeds + text_model.embeddings.position_embedding.weight[:length]
        mask = causal_mask(length, x.dtype, x.device)
        for layer in text_model.encoder.layers:
            x = layer(x, mask)
        x = text_model.final_layer_norm(x)
        pooled = x[torch.arange(len(x), device=x.device), eot.to(x.device)]
        return projection(pooled)

    @torch.inference_mode()
    def encode_texts(self, texts: Sequence[str], batch_size: int = 256, normalize: bool = True) -> torch.Tensor:
        """Text embeddings [T,P] (float32) of plain texts, L2-normalised unless `normalize=False` (CSP averages the
        raw embeddings of a prompt ensemble)."""
        out = []
        for start in range(0, len(texts), batch_size):
            ids = self.tokenize(texts[start:start + batch_size])
            with self.autocast():
                emb = self.text_from_embeddings(self.token_embeddings(ids), self.eot_index(ids))
            out.append(F.normalize(emb.float(), dim=-1) if normalize else emb.float())
        return torch.cat(out)

    def encode_class_prompts(self, class_names: Sequence[str],
                             templates: Sequence[str] = DEFAULT_TEMPLATES) -> torch.Tensor:
        """Normalised class embeddings [C,P]: each template's normalised embedding, averaged, renormalised."""
        texts = [t.format(name) for name in class_names for t in templates]
        emb = self.encode_texts(texts).view(len(class_names), len(templates), -1).mean(1)
        return F.normalize(emb, dim=-1)
