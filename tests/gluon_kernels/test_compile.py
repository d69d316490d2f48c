"""The offline compile examples' size cases (gluon_kernels/compile.py): an example naming size
arguments is compiled with all of them the constant 1, all marked divisible by 16, and neither,
as Triton specializes a launch's ints (the compiles themselves: tests/amd_compile/)."""

import pytest

from gluon_kernels.compile import SIZE_CASES, CompileExample, size_cases, with_sizes


class FakeKernel:
    arg_names = ["x_ptr", "M", "N", "BLOCK"]


KERNEL = FakeKernel()


def example(**fields) -> CompileExample:
    return CompileExample("kernel[tile]", KERNEL,
                          {"x_ptr": "*fp32", "M": "i32", "N": "i32", "BLOCK": "constexpr"},
                          {"BLOCK": 64}, **fields)


def test_each_size_case_specializes_the_size_arguments_as_a_launch_would():
    ones, aligned, unaligned = size_cases(example(size_args=("M", "N")))
    assert [e.name for e in (ones, aligned, unaligned)] == \
        [f"kernel[tile]@{case}" for case in SIZE_CASES]
    assert ones.signature["M"] == ones.signature["N"] == "constexpr"
    assert ones.constexprs == {"BLOCK": 64, "M": 1, "N": 1}
    assert aligned.signature == unaligned.signature == example().signature
    assert aligned.divisible_by_16 == ("M", "N") and unaligned.divisible_by_16 == ()


def test_an_example_without_size_arguments_is_compiled_once():
    assert size_cases(example()) == [example()]


def test_size_cases_refuse_unknown_cases_and_arguments():
    with pytest.raises(ValueError, match="unknown size case 'twos'"):
        with_sizes(example(size_args=("M",)), "twos")
    with pytest.raises(ValueError, match=r"size arguments \['K'\] are not in its signature"):
        with_sizes(example(size_args=("M", "K")), "ones")
