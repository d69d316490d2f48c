"""What a result file says about where it was measured, and writing it.

Every `--result-file` of `atomk31 bench` carries `environment`: the device, the torch, triton
and CUDA/ROCm versions, the Python version, the date and the git commit of the checkout the
package runs from (with `dirty: true` when it has uncommitted changes; "unknown" outside a
checkout). Result files for the README go to `benchmarks/results/YYYY-MM-DD_<gpu>_<bench>.json`.
"""

from __future__ import annotations

import datetime as dt
import json
import platform
import subprocess
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parents[1]


def git_commit(directory: Path = PACKAGE_DIR) -> tuple[str, bool | None]:
    """(commit hash, has uncommitted changes) of the checkout holding `directory`;
    ("unknown", None) when it is not one or git is missing."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                                text=True, check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=directory, capture_output=True, text=True, check=True,
                                timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    return commit, bool(status.strip())


def environment(device: torch.device | None = None) -> dict:
    """The `environment` block of a result file (module docstring)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit, dirty = git_commit()
    gpu = None
    if device is not None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
    return {"device": gpu or "CPU", "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "hip": torch.version.hip,
            "python": platform.python_version(), "date": dt.date.today().isoformat(),
            "commit": commit, "dirty": dirty}


def write_result_file(path: Path, result: dict) -> None:
    """Write `result` as indented JSON to `path` (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
