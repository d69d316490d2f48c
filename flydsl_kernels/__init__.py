"""FlyDSL kernels for AMD Instinct GPUs (gfx950):

* `sparse_mla`: sparse MLA reading the selected rows straight from the FP8 latent cache (the
  engine's strided pool view, in place), one workgroup per (query row, 16 local heads), fp8
  MFMA scores, online softmax, bf16 MFMA P·V.

The MXFP4 grouped MoE (SiTUv2, FP8 second stage) is not written yet; `moe_experts_mxfp4` runs
its Triton kernel on AMD. Kernels import flydsl, which exists only where it is installed
(`atomk31[amd]`); nothing here is imported by the engine before a kernel is chosen.
"""
