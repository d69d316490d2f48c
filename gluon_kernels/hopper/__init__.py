"""Gluon kernels for NVIDIA Hopper (sm_90: wgmma, TMA, warp specialization), the `hopper`
target's implementations (atomk31/ops registers them):

* `indexer_score`: DSA indexer scores over FP8 keys, a TMA producer warp and two consumer
  warpgroups (the kernel in indexer_score_kernel.py, its consumer, work split and query
  preparation beside it).
* `sparse_mla`, `dense_mla`: absorbed MLA over the FP8 latent, warp-specialized (a key
  producer, a scorer, a value worker: sparse_mla_kernel.py), sparse or dense.
* `ptpc_fp8`: the PTPC-FP8 GEMM (wgmma, TMA) for the large-GEMM shape class.

Gluon ships inside the triton wheel; nothing here runs under Triton's interpreter.
"""
