"""Curation of the data people have into this project's inputs: GBIF archives, image downloads, ImageNet-21K categories."""
