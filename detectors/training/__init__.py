"""training detectors (one module per method; each registers itself)."""
