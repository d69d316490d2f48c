"""Gluon kernels for AMD Instinct GPUs (gfx950 first, gfx942 where it applies), the `amd`
target's implementations (atomk31/ops registers them), each also instantiated for NVIDIA
(mma.sync) so its algorithm is tested on the GPUs at hand:

* `indexer_score`: DSA indexer scores on scaled MFMA (FP8 e4m3 and MXFP4 e2m1 keys), one
  program per (key tile, group of one request's rows), so each key is read once per group.
* `radix_topk`: multi-workgroup radix top-k sharing one row's digit histogram.

gluon_kernels/targets.py maps an architecture to its matrix instruction and layouts.
"""
