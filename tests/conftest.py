"""Shared test set-up: hardware markers skip with a reason that names the hardware, and
Triton's interpreter when no GPU is visible.

`@triton.jit` chooses the interpreter when a function is decorated, Triton's own library
functions (tl.sigmoid, ...) included, so TRITON_INTERPRET must be set before anything imports
triton: here, first thing in the session. Tests that compile for real targets (tests/amd_compile)
do so in subprocesses with the variable removed.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _has_rocm() -> bool:
    return torch.cuda.is_available() and torch.version.hip is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA or ROCm GPU; none is visible to torch")
    no_rocm = pytest.mark.skip(reason="needs a ROCm (AMD Instinct) GPU; none is visible to torch")
    for item in items:
        # markers, not keywords: a test folder named "amd" (tests/gluon_kernels/amd) is a
        # keyword of every test in it
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("amd") and not _has_rocm():
            item.add_marker(no_rocm)


TINY_SEED = 1234


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """The tiny preset (MODEL_SPEC §2.4), seed TINY_SEED, one shard. Read-only: copy it before
    editing."""
    from atomk31.checkpoint import make_checkpoint

    return make_checkpoint("tiny", seed=TINY_SEED, out=tmp_path_factory.mktemp("tiny"),
                           progress=False)
