"""Running the capture scripts (capture_triton_isa.py, capture_gluon_isa.py) for several targets,
and reading their reports."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

TRITON_SCRIPT = Path(__file__).with_name("capture_triton_isa.py")
CAPTURE_TIMEOUT_S = 600


def capture_reports(archs: tuple[str, ...], out_dir: Path,
                    script: Path = TRITON_SCRIPT) -> dict[str, dict]:
    """One ``script ARCH OUT.json`` subprocess per architecture, all at once, without
    TRITON_INTERPRET; {arch: the report it wrote}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    processes = {arch: subprocess.Popen([sys.executable, str(script), arch,
                                         str(out_dir / f"{arch}.json")],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for arch in archs}
    results = {}
    for arch, process in processes.items():
        output, _ = process.communicate(timeout=CAPTURE_TIMEOUT_S)
        assert process.returncode == 0, (
            f"{script.name} for {arch} failed:\n{output.decode(errors='replace')[-3000:]}")
        results[arch] = json.loads((out_dir / f"{arch}.json").read_text())
    return results


def compiled_by(report: dict, arch: str, example: str) -> list[dict]:
    """The kernels ``example`` compiled in ``report``; fails if its launcher raised, skips the
    test if it compiled nothing new (not applicable there, or the same binaries as an earlier
    example or size case: Triton compiles a specialization once)."""
    import pytest

    assert example not in report["errors"], f"{example} on {arch}: {report['errors'][example]}"
    compiled = [c for c in report["compiled"] if c["example"] == example]
    if not compiled:
        pytest.skip(f"{example} compiles nothing new on {arch} (not applicable there, or the "
                    f"binaries of an earlier example)")
    return compiled


def calls_dot(kernel_name: str) -> bool:
    """Whether the kernel multiplies matrices: its source, or that of a JIT helper of its
    module it calls (transitively), has tl.dot / tl.dot_scaled."""
    import importlib
    import pkgutil

    import atomk31.triton_kernels as package

    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if kernel_name not in vars(module):
            continue
        sources = {name: inspect.getsource(getattr(value, "fn", value))
                   for name, value in vars(module).items()
                   if hasattr(value, "fn") and getattr(value, "__module__", None) ==
                   module.__name__}
        seen, pending = set(), [kernel_name]
        while pending:
            name = pending.pop()
            if name in seen or name not in sources:
                continue
            seen.add(name)
            if "tl.dot(" in sources[name] or "tl.dot_scaled(" in sources[name]:
                return True
            pending += [other for other in sources if f"{other}(" in sources[name]]
        return False
    return False
