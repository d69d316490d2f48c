"""gluon_kernels/targets.py: the target a launch compiles for, read off Triton's active driver
(so a compile-only driver, tests/amd_compile, gets the architecture it compiles for)."""

from types import SimpleNamespace

import pytest

from gluon_kernels import targets


def with_driver(monkeypatch, backend: str, arch: object) -> None:
    from triton.runtime import driver

    target = SimpleNamespace(backend=backend, arch=arch, warp_size=64)
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_target=lambda: target),
                        raising=False)
    monkeypatch.setattr(type(driver), "active", property(lambda self: self._active))


@pytest.mark.parametrize("backend, arch, want, matmul", [
    ("hip", "gfx950", "gfx950", "mfma_scaled"), ("hip", "gfx942:sramecc+:xnack-", "gfx942", "mfma"),
    ("cuda", 90, "sm90", "mma_v2")])
def test_active_target_follows_the_driver(monkeypatch, backend, arch, want, matmul):
    with_driver(monkeypatch, backend, arch)
    target = targets.active_target()
    assert (target.arch, target.matmul) == (want, matmul)


def test_active_target_refuses_a_gpu_without_gluon_kernels(monkeypatch):
    with_driver(monkeypatch, "hip", "gfx1100")
    with pytest.raises(ValueError, match="no Gluon target for architecture 'gfx1100'"):
        targets.active_target()
