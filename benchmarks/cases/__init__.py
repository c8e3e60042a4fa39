"""Measurements shared by several benchmarks (and the test stand-ins built from them): CLIP scoring and prompt-training
throughput (`clip`), DIFFGUARD's batching and early stop (`diffguard`), classifier training and feature extraction
against plain PyTorch loops (`train`), and the shared tools: a throttling loopback image host, torchvision 0.14 in a
subprocess, peak RSS per stage, the interleaved best-of-N timer (`tools`)."""
