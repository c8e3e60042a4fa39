"""Helpers shared by the tests (pytest puts `tests/` on sys.path: `from helpers.toys import toy_features`).

- `images`: noisy colour images and their class names (CLIP and pixel-level detector tests);
- `toys`: toy FeatureSets with a linear head (feature- and logit-level detector tests);
- `models`: tiny image classifiers built in memory (pixel-level detector tests).
"""
