"""Prompt template lists of the CLIP detectors' reference code (data, not code)."""
from __future__ import annotations

# CLIPN's test prompts (xmed-lab/CLIPN src/prompt/prompt.txt): 64 "... of ..." templates, then each of them with
# "of" -> "with" ("in a video game" -> "appearing in a video game"); 128 in all.
_CLIPN_OF = (
    "a bad photo of a {}.", "a photo of many {}.", "a sculpture of a {}.", "a low resolution photo of the {}.",
    "a rendering of a {}.", "graffiti of a {}.", "a bad photo of the {}.", "a cropped photo of the {}.",
    "a tattoo of a {}.", "a bright photo of a {}.", "a photo of a clean {}.", "a photo of a dirty {}.",
    "a dark photo of the {}.", "a drawing of a {}.", "a photo of my {}.", "a photo of the cool {}.",
    "a close-up photo of a {}.", "a black and white photo of the {}.", "a painting of the {}.", "a painting of a {}.",
    "a pixelated photo of the {}.", "a sculpture of the {}.", "a bright photo of the {}.", "a cropped photo of a {}.",
    "a photo of the dirty {}.", "a jpeg corrupted photo of a {}.", "a blurry photo of the {}.", "a photo of the {}.",
    "a good photo of the {}.", "a rendering of the {}.", "a {} in a video game.", "a photo of one {}.",
    "a doodle of a {}.", "a close-up photo of the {}.", "a photo of a {}.", "the {} in a video game.",
    "a sketch of a {}.", "a doodle of the {}.", "a low resolution photo of a {}.", "a rendition of the {}.",
    "a photo of the clean {}.", "a photo of a large {}.", "a rendition of a {}.", "a photo of a nice {}.",
    "a photo of a weird {}.", "a blurry photo of a {}.", "art of a {}.", "a sketch of the {}.",
    "a pixelated photo of a {}.", "itap of the {}.", "a jpeg corrupted photo of the {}.", "a good photo of a {}.",
    "a photo of the nice {}.", "a photo of the small {}.", "a photo of the weird {}.", "a drawing of the {}.",
    "a photo of the large {}.", "a black and white photo of a {}.", "a dark photo of a {}.", "itap of a {}.",
    "graffiti of the {}.", "a photo of a cool {}.", "a photo of a small {}.", "a tattoo of the {}.",
)


def _with_variant(template: str) -> str:
    if "in a video game" in template:
        return template.replace("in a video game", "appearing in a video game")
    return template.replace(" of ", " with ", 1) if " of " in template else template.replace("of ", "with ", 1)


CLIPN_TEMPLATES_PLAIN: tuple[str, ...] = _CLIPN_OF + tuple(_with_variant(t) for t in _CLIPN_OF)
# The official code reads each line verbatim (minus "\n"): the single quotes, and a trailing comma on the two
# "a photo of/with a {}." lines, are part of the prompts it encodes. This is the default; the plain list is an option.
CLIPN_TEMPLATES: tuple[str, ...] = tuple(f"'{t}'," if t in ("a photo of a {}.", "a photo with a {}.") else f"'{t}'"
                                         for t in CLIPN_TEMPLATES_PLAIN)
