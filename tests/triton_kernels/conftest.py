"""Interpreter tests of this folder: the kernel module a test module names in KERNEL_MODULE
(or the last of KERNEL_MODULES), run by Triton's interpreter on CPU tensors.

The interpreter is chosen when triton is imported (tests/conftest.py sets TRITON_INTERPRET at
session start when no GPU is visible), so where a GPU is visible these tests skip: the
`gpu`-marked tests of the same files cover that machine.
"""

import importlib

import pytest
import torch


@pytest.fixture
def interpreted(request: pytest.FixtureRequest):
    if torch.cuda.is_available():
        pytest.skip("interpreter test: runs where no GPU is visible (the gpu tests cover this one)")
    names = getattr(request.module, "KERNEL_MODULES", None) or (request.module.KERNEL_MODULE,)
    return importlib.import_module(names[-1])
