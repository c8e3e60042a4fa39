"""OOD-data generation jobs built on `pipelines` (never imports `detectors`)."""
