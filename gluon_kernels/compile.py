"""Ahead-of-time compilation of the Gluon kernels, with no GPU present (CI's ISA checks).

Each kernel module lists ``compile_examples(target)``: the kernel, a signature of argument
types and the constexprs a real launch would use. ``compile_example`` hands one to
``triton.compile`` for the target's architecture; the result's ``asm`` holds the ISA
("amdgcn" on AMD, "ptx" on NVIDIA) and its metadata the register and scratch use.
"""

from dataclasses import dataclass, field

import triton
from triton.experimental.gluon._runtime import GluonASTSource

from gluon_kernels.targets import GluonTarget


@dataclass(frozen=True)
class CompileExample:
    """One instantiation of a kernel: what a launch on ``target`` would compile."""

    name: str  # e.g. "indexer_score[mxfp4]"
    fn: object  # the @gluon.jit function
    signature: dict[str, str]  # argument -> triton type ("*u8", "i32", "constexpr")
    constexprs: dict[str, object] = field(default_factory=dict)
    num_warps: int = 4
    # What the ISA must show: substrings of the AMD assembly (e.g. "v_mfma_scale_f32").
    expected_instructions: tuple[str, ...] = ()
    # Most VGPRs per lane the design allows (occupancy target); None = not checked.
    max_vgprs: int | None = None


def compile_example(example: CompileExample, target: GluonTarget) -> object:
    """Compile ``example`` for ``target`` without a device; returns triton's CompiledKernel."""
    source = GluonASTSource(fn=example.fn, signature=example.signature,
                            constexprs=example.constexprs)
    return triton.compile(source, target=target.compile_target(),
                          options={"num_warps": example.num_warps})


def pointer_signature(arguments: dict[str, str], constexpr_names: list[str]) -> dict[str, str]:
    """A full signature: the given argument types plus "constexpr" for each constexpr name."""
    return {**arguments, **{name: "constexpr" for name in constexpr_names}}
