"""Curating the data the papers start from: GBIF archives, image downloads, ImageNet-21K container categories."""
