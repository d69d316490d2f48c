"""Gluon kernels written for NVIDIA Hopper (sm_90): wgmma, TMA, warp specialization."""
