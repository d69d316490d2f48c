"""Ahead-of-time compilation of the Gluon kernels, with no GPU present (CI's ISA checks).

Each kernel module lists ``compile_examples(target)``: the kernel, a signature of argument
types and the constexprs a real launch would use. ``compile_example`` hands one to
``triton.compile`` for the target's architecture; the result's ``asm`` holds the ISA
("amdgcn" on AMD, "ptx" on NVIDIA) and its metadata the register and scratch use.

Size specialization: a launch specializes every int argument, as Triton does: one equal to 1
becomes the constant 1, one divisible by 16 is marked so (``tt.divisibility``). An example names
its run-time size arguments (``size_args``: token counts, rows, M / N / K, never a model
constant), and ``size_cases`` gives it once per SIZE_CASES entry, so each kernel is compiled
with every size 1, with every size a multiple of 16, and with none (the plain signature).
"""

import dataclasses
from dataclasses import dataclass, field

import triton
from triton.experimental.gluon._runtime import GluonASTSource

from gluon_kernels.targets import GluonTarget

# How the size arguments arrive: all equal to 1 (constants), all multiples of 16, neither.
SIZE_CASES = ("ones", "multiples_of_16", "unaligned")


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
    # The run-time int size arguments (see the module docstring), and those of them marked
    # divisible by 16 in this instantiation.
    size_args: tuple[str, ...] = ()
    divisible_by_16: tuple[str, ...] = ()
    # Compile options beside num_warps (e.g. {"maxnreg": 168}).
    options: dict[str, object] = field(default_factory=dict)


def size_cases(example: CompileExample) -> list[CompileExample]:
    """``example`` once per SIZE_CASES entry, named "<name>@<case>" (the example alone when it
    names no size arguments)."""
    if not example.size_args:
        return [example]
    return [with_sizes(example, case) for case in SIZE_CASES]


def with_sizes(example: CompileExample, case: str) -> CompileExample:
    """``example`` with its size arguments specialized as ``case`` (one of SIZE_CASES)."""
    if case not in SIZE_CASES:
        raise ValueError(f"unknown size case {case!r}; expected one of {SIZE_CASES}")
    missing = [name for name in example.size_args if name not in example.signature]
    if missing:
        raise ValueError(f"{example.name}: size arguments {missing} are not in its signature")
    name = f"{example.name}@{case}"
    if case == "ones":
        signature = {**example.signature, **{arg: "constexpr" for arg in example.size_args}}
        constexprs = {**example.constexprs, **{arg: 1 for arg in example.size_args}}
        return dataclasses.replace(example, name=name, signature=signature,
                                   constexprs=constexprs)
    divisible = example.size_args if case == "multiples_of_16" else ()
    return dataclasses.replace(example, name=name, divisible_by_16=divisible)


def compile_example(example: CompileExample, target: GluonTarget) -> object:
    """Compile ``example`` for ``target`` without a device; returns triton's CompiledKernel."""
    arg_names = example.fn.arg_names
    attrs = {(arg_names.index(arg),): [["tt.divisibility", 16]]
             for arg in example.divisible_by_16}
    source = GluonASTSource(fn=example.fn, signature=example.signature,
                            constexprs=example.constexprs, attrs=attrs)
    return triton.compile(source, target=target.compile_target(),
                          options={"num_warps": example.num_warps, **example.options})


def pointer_signature(arguments: dict[str, str], constexpr_names: list[str]) -> dict[str, str]:
    """A full signature: the given argument types plus "constexpr" for each constexpr name."""
    return {**arguments, **{name: "constexpr" for name in constexpr_names}}
