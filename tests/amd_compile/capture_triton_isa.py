"""Compile every Triton kernel of atomk31/triton_kernels for an AMD GPU (or for Hopper), with no
GPU present.

Run as a script (the compile-check tests start it in a subprocess, one per architecture):

    python tests/amd_compile/capture_triton_isa.py gfx950 report.json
    python tests/amd_compile/capture_triton_isa.py sm90 report.json

How: a stand-in triton driver reports ``GPUTarget("hip", ARCH, 64)`` (``GPUTarget("cuda", 90,
32)`` for sm90) as the current device,
so each ``kernel[grid](...)`` of a launcher compiles for that architecture exactly as a real
launch would (same argument specialisation, same constexprs and options); loading and
launching are no-ops. The launchers are called with small CPU tensors from
``triton_launch_examples.EXAMPLES``; the kernels' outputs are garbage, only the compiled
ISA is kept. The report lists, per compiled kernel: its name, the example that reached it,
whether the AMD assembly holds MFMA instructions, VGPR/AGPR/SGPR counts, spills, private
(scratch) segment size and LDS bytes (for sm90: the PTX's tensor-core instructions and the
cubin's registers and stack bytes, read with the cuobjdump that ships with triton); and, per
example, an error if the launcher failed.
"""

import json
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LDS_BYTES = {"gfx950": 160 * 1024, "gfx942": 64 * 1024, "sm90": 227 * 1024}
WARP_SIZE = {"sm90": 32}


class _NoOpLauncher:
    def __init__(self, src: object, metadata: object) -> None:
        pass

    def __call__(self, *args: object) -> None:
        return None


class _Utils:
    def __init__(self, arch: str) -> None:
        self.arch = arch

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple:
        return None, 0, 0, 0, 1024

    def get_device_properties(self, device: int) -> dict:
        return {"max_shared_mem": LDS_BYTES.get(self.arch, 64 * 1024), "multiprocessor_count": 256,
                "max_num_regs": 512, "warpSize": WARP_SIZE.get(self.arch, 64),
                "sm_clock_rate": 2400000,
                "mem_clock_rate": 2600000, "mem_bus_width": 8192, "arch": self.arch}


class CompileOnlyDriver:
    """A triton driver whose device is an AMD GPU of ``arch`` (or Hopper, "sm90") that never
    runs anything."""

    def __init__(self, arch: str) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32) if arch == "sm90" else GPUTarget("hip", arch, 64)
        self.utils = _Utils(arch)
        self.launcher_cls = _NoOpLauncher

    def is_active(self) -> bool:
        return True

    def get_current_target(self) -> object:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> object:
        import torch

        return torch.device("cpu")

    def get_device_interface(self) -> object:
        import torch

        return torch.cuda

    def get_benchmarker(self) -> object:
        return lambda *args, **kwargs: 1.0

    def get_empty_cache_for_benchmark(self) -> object:
        import torch

        return torch.empty(1)

    def clear_cache(self, cache: object) -> None:
        pass

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty


def isa_summary(compiled: object) -> dict:
    """MFMA use, registers, spills, scratch and LDS of one compiled kernel."""
    amdgcn = compiled.asm.get("amdgcn", "")

    def field(name: str) -> int | None:
        found = re.search(rf"\.{name}:\s+(\d+)", amdgcn)
        return int(found.group(1)) if found else None

    return {
        "mfma": sorted(set(re.findall(r"\bv_mfma\w*", amdgcn))),
        "vgpr_count": field("vgpr_count"), "agpr_count": field("agpr_count"),
        "sgpr_count": field("sgpr_count"), "vgpr_spill_count": field("vgpr_spill_count"),
        "sgpr_spill_count": field("sgpr_spill_count"),
        "private_segment_fixed_size": field("private_segment_fixed_size"),
        "lds_bytes": int(getattr(compiled.metadata, "shared", 0)),
        "num_warps": int(compiled.metadata.num_warps),
    }


def sass_summary(compiled: object) -> dict:
    """Tensor-core instructions in the PTX; registers and stack bytes (spills) of the cubin."""
    import triton

    ptx = compiled.asm.get("ptx", "")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage[:500]}")
    return {
        "mma": sorted(set(re.findall(r"\b(wgmma\.mma_async|mma\.sync)", ptx))),
        "registers": int(found.group(1)), "stack_bytes": int(found.group(2)),
        "local_bytes": int(found.group(4)),
        "shared_bytes": int(getattr(compiled.metadata, "shared", 0)),
        "num_warps": int(compiled.metadata.num_warps),
    }


def capture(arch: str) -> dict:
    import triton
    from triton.runtime.driver import driver

    driver.set_active(CompileOnlyDriver(arch))
    compiled: list[dict] = []
    current = {"example": None}

    import triton.compiler.compiler as compiler_module

    original_compile = compiler_module.compile

    def recording_compile(src: object, target: object = None, options: object = None,
                          **kwargs: object) -> object:
        kernel = original_compile(src, target=target, options=options, **kwargs)
        name = getattr(getattr(src, "fn", None), "__name__", str(src))
        summary = sass_summary(kernel) if arch == "sm90" else isa_summary(kernel)
        compiled.append({"kernel": name, "example": current["example"], **summary})
        return kernel

    # JITFunction.create_binder reads `compile` from triton.compiler at first launch.
    compiler_module.compile = recording_compile
    triton.compiler.compile = recording_compile

    from triton_launch_examples import EXAMPLES, triton_kernel_names

    errors = {}
    for name, example in EXAMPLES.items():
        current["example"] = name
        try:
            example()
        except Exception as error:  # reported, not raised: one bad example must not hide others
            errors[name] = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}"
    return {"arch": arch, "triton": triton.__version__, "compiled": compiled, "errors": errors,
            "kernels": triton_kernel_names()}


def main() -> None:
    arch, out = sys.argv[1], Path(sys.argv[2])
    out.write_text(json.dumps(capture(arch), indent=1))


if __name__ == "__main__":
    main()
