"""Where kernels will run: the target a kernel table is built for, and the step's fixed facts.

A `Target` names a device class (``cpu``, ``sm90``, ``gfx950``, ...) and the optional kernel
packages it has. `Target.of_device` reads it off a real device; `Target.named` makes one from
its name alone, so that `atomk31 info --target gfx950` can print the tables of a machine that
is not here (it then assumes the packages of that target's standard install: the ROCm
container has FlyDSL and aiter, a CUDA install has Triton with Gluon).

A `KernelContext` adds what the engine fixes at start-up and kernels care about: the compute
dtype, the latent cache's dtype, the index-key format and the block size. Implementations
answer "why not" against it once, when the tables are built (ops/registry.py), so that a call
never discovers that its kernel cannot take the engine's tensors.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import torch

# Optional packages that some implementations need; probed on a real device.
KERNEL_PACKAGES = ("triton", "flydsl", "aiter", "mori")
# What `Target.named` assumes each kind of target has installed.
_STANDARD_PACKAGES = {
    "cpu": frozenset(),
    "nvidia": frozenset({"triton"}),
    "amd": frozenset({"triton", "flydsl", "aiter"}),
}
_FP8_VARIANT = {"gfx942": "e4m3fnuz"}   # every other FP8 target runs OCP e4m3fn (§6.1)
NAMED_TARGETS = ("cpu", "sm90", "sm80", "sm100", "gfx950", "gfx942")


@dataclass(frozen=True)
class Target:
    """A device class kernels are chosen for.

    name: "cpu", "sm<major><minor>" for NVIDIA GPUs ("sm90": Hopper), or the gfx name of a
    ROCm GPU ("gfx950", "gfx942"). vendor: "cpu" | "nvidia" | "amd". packages: the optional
    kernel packages importable there (KERNEL_PACKAGES). is_present: read off a real device
    (False for `Target.named`, whose packages are assumed).
    """

    name: str
    vendor: str
    packages: frozenset[str] = field(default_factory=frozenset)
    is_present: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"

    @property
    def fp8_variant(self) -> str:
        return _FP8_VARIANT.get(self.name, "e4m3fn")

    @classmethod
    def named(cls, name: str) -> Target:
        """The target called ``name`` with its standard packages (no device needed)."""
        if name == "cpu":
            vendor = "cpu"
        elif name.startswith("sm") and name[2:].isdigit():
            vendor = "nvidia"
        elif name.startswith("gfx") and len(name) > 3:
            vendor = "amd"
        else:
            raise ValueError(f"unknown target {name!r}; name one of {', '.join(NAMED_TARGETS)} "
                             "(or any sm<NN> / gfx<NNN>)")
        return cls(name, vendor, _STANDARD_PACKAGES[vendor])

    @classmethod
    def of_device(cls, device: torch.device | str) -> Target:
        """The target of a real device, with the packages actually installed."""
        device = torch.device(device)
        if device.type != "cuda":
            return cls("cpu", "cpu", frozenset(), is_present=True)
        packages = frozenset(p for p in KERNEL_PACKAGES if importlib.util.find_spec(p) is not None)
        if torch.version.hip is not None:
            arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
            return cls(arch, "amd", packages, is_present=True)
        major, minor = torch.cuda.get_device_capability(device)
        return cls(f"sm{major}{minor}", "nvidia", packages, is_present=True)


@dataclass(frozen=True)
class KernelContext:
    """The target plus the facts of every step that kernels depend on (fixed at start-up).

    compute_dtype: activations (bf16 on GPUs, float32 on CPU); latent_dtype: the MLA latent
    cache (an FP8 dtype or the compute dtype); index_format: "fp8" | "mxfp4" index keys;
    block_size: tokens per cache block.
    """

    target: Target
    compute_dtype: torch.dtype = torch.bfloat16
    latent_dtype: torch.dtype = torch.float8_e4m3fn
    index_format: str = "fp8"
    block_size: int = 128

    @classmethod
    def default_for(cls, target: Target) -> KernelContext:
        """The engine's defaults on ``target`` (what `atomk31 info --target` assumes): BF16
        compute with an FP8 latent on GPUs (e4m3fnuz on gfx942), float32 on CPU."""
        if not target.is_gpu:
            return cls(target, torch.float32, torch.float32)
        fp8 = torch.float8_e4m3fnuz if target.fp8_variant == "e4m3fnuz" else torch.float8_e4m3fn
        return cls(target, torch.bfloat16, fp8)
