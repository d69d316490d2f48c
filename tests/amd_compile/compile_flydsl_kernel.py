"""Compile one FlyDSL kernel for an AMD architecture in this process (run as a subprocess).

    ROCM_PATH=... COMPILE_ONLY=1 ARCH=gfx950 FLYDSL_DEBUG_DUMP_ASM=1 FLYDSL_DUMP_DIR=DIR \
        python tests/amd_compile/compile_flydsl_kernel.py \
        amd_compile.flydsl_launch_examples sparse_mla_engine_view

FlyDSL reads those settings from the environment, which is why the tests start this script
with its own environment instead of setting variables in the test process.
"""

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: amd_compile.*


def main() -> None:
    module, function = sys.argv[1], sys.argv[2]
    getattr(importlib.import_module(module), function)()


if __name__ == "__main__":
    main()
