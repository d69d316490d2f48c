"""One small launch per Triton launcher, so every kernel of atomk31/triton_kernels compiles.

Each example calls a launcher of atomk31/triton_kernels with CPU tensors shaped by the op's
contract (atomk31/ops/) at K3.1's per-head sizes (128-wide keys and values, 576-wide latent
rows, 32 indexer heads). capture_triton_isa.py runs them under a compile-only driver, so the
kernels compile for gfx950 / gfx942 exactly as a launch on that GPU would; nothing executes.

A new launcher needs one entry here; test_triton_compile.py fails, naming the kernel, when a
`*_kernel` of atomk31/triton_kernels is reached by no example.
"""

import importlib
import pkgutil
from collections.abc import Callable

import torch

NUM_INDEX_HEADS = 32
KDA_HEADS = 2
HEAD_DIM = 128


def triton_kernel_names() -> list[str]:
    """Every `*_kernel` JIT function defined in the modules of atomk31/triton_kernels."""
    from triton.runtime.jit import JITFunction

    import atomk31.triton_kernels as package

    names = []
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        for name, value in vars(module).items():
            fn = getattr(value, "fn", None)
            is_jit = isinstance(value, JITFunction) or isinstance(fn, JITFunction)
            if is_jit and name.endswith("_kernel") and getattr(value, "__module__",
                                                                module.__name__) == module.__name__:
                names.append(name)
    return sorted(set(names))


def _fp8_variant() -> str:
    """The FP8 variant of the architecture being compiled (gfx942 runs e4m3fnuz, §6.1)."""
    from triton.runtime.driver import driver

    return "e4m3fnuz" if driver.active.get_current_target().arch == "gfx942" else "e4m3fn"


def _index_cache(index_format: str, num_blocks: int, block_size: int):
    if index_format == "fp8":
        fp8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[_fp8_variant()]
        return (torch.zeros(num_blocks, block_size, 128, dtype=fp8),
                torch.ones(num_blocks, block_size))
    return (torch.zeros(num_blocks, block_size, 64, dtype=torch.uint8),
            torch.full((num_blocks, block_size, 4), 127, dtype=torch.uint8))


def indexer_score(index_format: str, use_fp8_dot: bool) -> Callable[[], None]:
    def run() -> None:
        from atomk31.triton_kernels.indexer_score import indexer_score_triton

        if use_fp8_dot and _fp8_variant() == "e4m3fnuz":
            return  # the FP8 dot path is for e4m3fn targets (gfx950) only
        block_size, num_rows = 64, 8
        values, scales = _index_cache(index_format, 4, block_size)
        block_table = torch.arange(4, dtype=torch.int32)[None]
        indexer_score_triton(
            torch.randn(num_rows, NUM_INDEX_HEADS, 128), torch.randn(num_rows, NUM_INDEX_HEADS),
            values, scales, index_format, _fp8_variant(), block_table,
            torch.zeros(num_rows, dtype=torch.int32), torch.arange(200, 200 + num_rows),
            block_size, use_fp8_dot=use_fp8_dot)
    return run


def kv_write(index_format: str, latent_dtype: torch.dtype) -> Callable[[], None]:
    def run() -> None:
        from atomk31.triton_kernels.kv_write import kv_write_triton

        num_blocks, block_size, num_tokens = 2, 16, 5
        values, scales = _index_cache(index_format, num_blocks, block_size)
        dtype = latent_dtype
        if dtype == torch.float8_e4m3fn and _fp8_variant() == "e4m3fnuz":
            dtype = torch.float8_e4m3fnuz
        latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=dtype)
        kv_write_triton(torch.randn(num_tokens, 576), torch.randn(num_tokens, 128),
                        torch.arange(num_tokens), latent_cache, 1.0, values, scales,
                        index_format, _fp8_variant())
    return run


def _kda_inputs(shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(*shape, HEAD_DIM, dtype=torch.bfloat16) for _ in range(3))
    g = -torch.rand(*shape, HEAD_DIM)
    beta = torch.rand(*shape)
    return q, k, v, g, beta


def kda_decode() -> None:
    from atomk31.triton_kernels.kda_decode import kda_decode_triton

    q, k, v, g, beta = _kda_inputs((3, KDA_HEADS))
    kda_decode_triton(q, k, v, g, beta, torch.zeros(3, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                      HEAD_DIM ** -0.5)


def kda_verify() -> None:
    from atomk31.triton_kernels.kda_decode import kda_verify_triton

    q, k, v, g, beta = _kda_inputs((2, 4, KDA_HEADS))
    kda_verify_triton(q, k, v, g, beta, torch.zeros(2, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                      HEAD_DIM ** -0.5)


def kda_prefill() -> None:
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    q, k, v, g, beta = _kda_inputs((100, KDA_HEADS))
    kda_prefill_triton(q, k, v, g, beta, torch.zeros(2, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                       torch.tensor([0, 70, 100], dtype=torch.int32), HEAD_DIM ** -0.5,
                       snapshot_at=torch.tensor([[0, 64]]))


def short_conv() -> None:
    from atomk31.triton_kernels.kda_conv import conv_state_after_triton, short_conv_silu_triton

    channels, width = 256, 4
    z = torch.randn(9, channels, dtype=torch.bfloat16)
    conv_state = torch.zeros(2, width - 1, channels, dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0, 4, 9], dtype=torch.int32)
    has_initial_state = torch.tensor([True, False])
    short_conv_silu_triton(z, torch.randn(channels, width), conv_state, cu_seqlens,
                           has_initial_state)
    conv_state_after_triton(z, conv_state, cu_seqlens, has_initial_state,
                            torch.tensor([[0, 2], [1, 5]]))


EXAMPLES: dict[str, Callable[[], None]] = {
    "indexer_score[fp8]": indexer_score("fp8", use_fp8_dot=False),
    "indexer_score[fp8, fp8 dot]": indexer_score("fp8", use_fp8_dot=True),
    "indexer_score[mxfp4]": indexer_score("mxfp4", use_fp8_dot=False),
    "kv_write[bf16 latent, fp8 keys]": kv_write("fp8", torch.bfloat16),
    "kv_write[fp8 latent, mxfp4 keys]": kv_write("mxfp4", torch.float8_e4m3fn),
    "kda_decode": kda_decode,
    "kda_verify": kda_verify,
    "kda_prefill": kda_prefill,
    "short_conv": short_conv,
}
