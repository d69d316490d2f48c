"""Run every Gluon launch example for one target under the compile-only driver, with no GPU,
and report what each compiled.

    python tests/amd_compile/capture_gluon_launches.py gfx950 report.json

test_gluon_launches.py starts it in a subprocess per target (TRITON_INTERPRET removed: the
test session sets it). The driver and the per-kernel summaries are capture_triton_isa.py's;
for AMD targets the summary also says whether every scaled MFMA takes both operands as FP4
(``cbsz:4 blgp:4``, the MXFP4 path), for sm90 the PTX's wgmma, 16-byte loads, setmaxnreg and
TMA loads, and for every kernel the arguments the launch passed as the constant 1. The report: {"compiled": [{kernel, example, ...}],
"errors": {example: traceback}}; an example that compiles nothing on a target (a Hopper
kernel on AMD) is not an error.
"""

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: amd_compile.*
sys.path.insert(0, str(Path(__file__).resolve().parent))


def summary(arch: str, kernel: object) -> dict:
    from capture_triton_isa import isa_summary, sass_summary

    if arch.startswith("sm"):
        ptx = kernel.asm["ptx"]
        return {**sass_summary(kernel), "wgmma": ptx.count("wgmma.mma_async"),
                "ld_global_v4": ptx.count("ld.global.v4"), "setmaxnreg": ptx.count("setmaxnreg"),
                "tma_loads": ptx.count("cp.async.bulk.tensor")}
    scaled = [line for line in kernel.asm["amdgcn"].splitlines() if "v_mfma_scale" in line]
    return {**isa_summary(kernel),
            "scaled_mfma_fp4": bool(scaled) and all("cbsz:4 blgp:4" in line for line in scaled)}


def arguments_equal_to_one(src: object) -> list[str]:
    """The kernel's non-constexpr arguments that this launch passed as the constant 1 (Triton's
    specialization of an integer argument equal to 1)."""
    fn = src.fn
    return [name for i, name in enumerate(fn.arg_names)
            if not fn.params[i].is_constexpr and src.signature.get(name) == "constexpr"
            and src.constants.get((i,)) == 1]


def capture(arch: str) -> dict:
    import triton
    import triton.compiler.compiler as compiler_module
    from capture_triton_isa import CompileOnlyDriver
    from triton.runtime.driver import driver

    driver.set_active(CompileOnlyDriver(arch))
    compiled: list[dict] = []
    current = {"example": None}
    original_compile = compiler_module.compile

    def recording_compile(src: object, target: object = None, options: object = None,
                          **kwargs: object) -> object:
        kernel = original_compile(src, target=target, options=options, **kwargs)
        name = getattr(getattr(src, "fn", None), "__name__", str(src))
        compiled.append({"kernel": name, "example": current["example"],
                         "ones": arguments_equal_to_one(src), **summary(arch, kernel)})
        return kernel

    compiler_module.compile = recording_compile
    triton.compiler.compile = recording_compile

    from amd_compile.gluon_launch_examples import EXAMPLES

    errors = {}
    for name, example in EXAMPLES.items():
        current["example"] = name
        try:
            example()
        except Exception as error:  # reported, not raised: one bad example must not hide others
            errors[name] = f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=6)}"
    return {"arch": arch, "triton": triton.__version__, "compiled": compiled, "errors": errors}


def main() -> None:
    arch, out = sys.argv[1], Path(sys.argv[2])
    out.write_text(json.dumps(capture(arch), indent=1))


if __name__ == "__main__":
    main()
