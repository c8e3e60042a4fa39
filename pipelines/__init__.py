"""Model-level building blocks shared by `gen` and `detectors`: runtime policy, data formats, models, features."""
