"""Gluon kernels, by target: `hopper/` (NVIDIA sm_90) and `amd/` (gfx950, gfx942).

Shared by both: `targets` (an architecture's matrix instruction and register layouts) and
`compile` (ahead-of-time compiles of a kernel's instantiations with no GPU, for the ISA checks
of tests/amd_compile/). Kernels import no engine code (atomk31.ops, model, engine).
"""
