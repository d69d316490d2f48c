"""Assertion helpers shared by the test folders (importable: pyproject puts tests/ on the path)."""

import torch


def assert_relative_close(name: str, actual: torch.Tensor, expected: torch.Tensor,
                          tolerance: float) -> None:
    """Max-abs error over max-abs value of expected, reported with the tensor's name."""
    assert actual.shape == expected.shape, \
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    error = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = expected.double().abs().max().item() if expected.numel() else 0.0
    relative = error / scale if scale else error
    assert relative <= tolerance, \
        f"{name}: max-abs error {error:.3g}, relative {relative:.3g} > {tolerance}"
