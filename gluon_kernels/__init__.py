"""Gluon kernels for AMD Instinct GPUs (gfx950 first): FP8/MXFP4 indexer scoring, multi-workgroup
radix top-k. Each kernel's algorithm also instantiates for NVIDIA so it can be tested there.
(Filled in by the AMD-path issue.)"""
