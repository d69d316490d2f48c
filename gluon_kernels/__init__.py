"""Gluon kernels for AMD Instinct GPUs (gfx950 first, gfx942 where it applies), each also
instantiated for NVIDIA so its algorithm is tested on the GPUs at hand:

* `indexer_score`: DSA indexer scores on scaled MFMA (FP8 e4m3 and MXFP4 e2m1 keys), one
  program per (key tile, group of one request's rows), so each key is read once per group.
* `radix_topk`: multi-workgroup radix top-k sharing one row's digit histogram.

`targets` maps an architecture to its matrix instruction and layouts; `compile` compiles any
kernel's instantiations without a GPU (tests/amd_compile/).
"""
