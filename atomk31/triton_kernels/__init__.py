"""Portable Triton kernels (CUDA and ROCm), one file per op or stage (DESIGN.md §2, STYLE.md #2).

Each file holds its kernels and one launcher per entry point (`<op>_triton`: check, allocate,
grid, launch) and nothing else: no engine imports, no environment reads, no compiling at
import. The op modules in `atomk31/ops/` register the launchers under the `triton` backend.
Launchers also accept CPU tensors, which Triton runs only under its interpreter
(TRITON_INTERPRET=1, set by the tests before the kernel module is imported).
"""
