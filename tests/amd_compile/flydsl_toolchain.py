"""The pieces FlyDSL's compile-only mode needs on a machine without ROCm, set up by the tests.

FlyDSL (COMPILE_ONLY=1 ARCH=gfx950) links the code object with ``$ROCM_PATH/llvm/bin/ld.lld``
and looks for the device libraries in ``$ROCM_PATH/amdgcn/bitcode``. Without ROCm we build a
stand-in ROCM_PATH: Debian's lld-19 (apt-installed when missing and we are root, as CI is)
and the ocml/ockl bitcode that triton's AMD backend ships.
"""

import os
import shutil
import subprocess
from pathlib import Path

LLD_CANDIDATES = ("ld.lld", "ld.lld-19", "/usr/lib/llvm-19/bin/ld.lld")


def find_lld() -> str | None:
    for candidate in LLD_CANDIDATES:
        found = shutil.which(candidate) or (candidate if os.path.isfile(candidate) else None)
        if found:
            return found
    return None


def ensure_lld() -> str | None:
    """Path of an ld.lld, apt-installing Debian's lld-19 if none is there and we are root."""
    found = find_lld()
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, capture_output=True,
                   timeout=300)
    subprocess.run(["apt-get", "install", "-y", "-qq", "lld-19"], check=False, env=env,
                   capture_output=True, timeout=600)
    return find_lld()


def make_rocm_path(root: Path) -> Path | None:
    """A stand-in ROCM_PATH under ``root`` (ld.lld + device bitcode), or None if no lld."""
    lld = ensure_lld()
    if lld is None:
        return None
    import triton

    bitcode = Path(triton.__file__).parent / "backends" / "amd" / "lib"
    (root / "llvm" / "bin").mkdir(parents=True, exist_ok=True)
    (root / "amdgcn").mkdir(parents=True, exist_ok=True)
    linker = root / "llvm" / "bin" / "ld.lld"
    if not linker.exists():
        linker.symlink_to(Path(lld).resolve())
    if not (root / "amdgcn" / "bitcode").exists():
        (root / "amdgcn" / "bitcode").symlink_to(bitcode)
    return root
