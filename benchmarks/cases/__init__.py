"""Measurements shared by several benchmarks (and the test stand-ins built from them): CLIP scoring and prompt-training
throughput (`clip`), DIFFGUARD's batching and early stop (`diffguard`), classifier training and feature extraction
against plain PyTorch loops (`train`)."""
