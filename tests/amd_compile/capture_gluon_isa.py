"""Compile every Gluon kernel example for one target, with no GPU, and write the assembly.

Run as a script (test_gluon_compile.py starts it in a subprocess per target, with
TRITON_INTERPRET removed from its environment: the test session sets it, and under it the
kernels' @jit helpers become interpreter functions that the compiler cannot reference):

    python tests/amd_compile/capture_gluon_isa.py gfx950 report.json

The report maps each example name (one per size case: gluon_kernels/compile.py's
``size_cases``) to {"asm": the AMD assembly or the PTX} or {"error": ...}.
"""

import json
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def capture(arch: str) -> dict[str, dict[str, str]]:
    from gluon_kernels.compile import compile_example, size_cases
    from gluon_kernels.hopper import ptpc_fp8
    from gluon_kernels.targets import target_for_arch

    target = target_for_arch(arch)
    asm_kind = "ptx" if arch.startswith("sm") else "amdgcn"
    report = {}
    for module in (ptpc_fp8,):
        for example in (case for e in module.compile_examples(target) for case in size_cases(e)):
            try:
                report[example.name] = {"asm": compile_example(example, target).asm[asm_kind]}
            except Exception as error:  # reported, not raised: one failure must not hide others
                report[example.name] = {"error": f"{type(error).__name__}: {error}\n"
                                                 f"{traceback.format_exc(limit=4)}"}
    return report


def main() -> None:
    arch, out = sys.argv[1], Path(sys.argv[2])
    out.write_text(json.dumps(capture(arch)))


if __name__ == "__main__":
    main()
