"""FlyDSL kernels for AMD Instinct GPUs: sparse MLA over the FP8 latent cache, the MXFP4 grouped
SiTU-GLU MoE. (Filled in by the AMD-path issue.)"""
