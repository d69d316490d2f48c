"""What a launcher needs to know about where its kernel runs."""

import functools

import torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction


def runs_on_interpreter(kernel: object) -> bool:
    """True under TRITON_INTERPRET=1, where `@triton.jit` gives an InterpretedFunction.

    Launchers pick interpreter-safe variants there (fp32 dots, explicit FP8 rounding). Deciding
    by the kernel object rather than by the tensors' device keeps a compile-only driver fed with
    CPU tensors (tests/amd_compile) on the configuration a GPU launch would use.
    """
    return not isinstance(kernel, JITFunction)


def dot_precision(kernel: object, dtype: torch.dtype) -> str:
    """`input_precision` for fp32 `tl.dot`s: "ieee" under the interpreter and for float32
    inputs (float32 compute must not silently become TF32); else "tf32" where the hardware has
    it: NVIDIA, and gfx942 (as xf32). gfx950 has no TF32 matrix instruction: "ieee" there."""
    if runs_on_interpreter(kernel) or dtype == torch.float32:
        return "ieee"
    target = driver.active.get_current_target()
    return "tf32" if target.backend == "cuda" or target.arch == "gfx942" else "ieee"


def num_sms(device: torch.device) -> int:
    """Multiprocessors (CUs) of a CUDA / ROCm device; 1 off a GPU (interpreter, compile checks:
    their launches are sized as for a one-multiprocessor GPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return _num_sms_of_cuda_device(device.index if device.index is not None
                                   else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms_of_cuda_device(index: int) -> int:
    """Cached: launchers run every decode step, and eager launches are CPU-bound."""
    return torch.cuda.get_device_properties(index).multi_processor_count
