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
from kda_launch_examples import HEAD_DIM, KDA_EXAMPLES, KDA_HEADS
from moe_launch_examples import MOE_EXAMPLES

NUM_INDEX_HEADS = 32


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


def _fp8_dtype() -> torch.dtype:
    return {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[_fp8_variant()]


def attn_res() -> None:
    from atomk31.triton_kernels.attn_res import attn_res_triton

    hidden_size = 7168  # the model's D (§2): one program holds a whole row
    attn_res_triton(torch.randn(3, 5, hidden_size, dtype=torch.bfloat16),
                    torch.randn(hidden_size), torch.randn(hidden_size), 1e-6)


def gated_rms_norm() -> None:
    from atomk31.triton_kernels.gated_rms_norm import gated_rms_norm_triton

    x, gate = (torch.randn(5, KDA_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    gated_rms_norm_triton(x, gate, torch.randn(HEAD_DIM), 1e-6)


def gated_rms_norm_fp8() -> None:
    from atomk31.triton_kernels.gated_rms_norm import gated_rms_norm_fp8_triton

    x, gate = (torch.randn(5, KDA_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    gated_rms_norm_fp8_triton(x, gate, torch.randn(HEAD_DIM), 1e-6, _fp8_dtype())


def ptpc_linear(num_tokens: int, in_features: int) -> Callable[[], None]:
    """The quantizer, then the FP8 GEMM with the launcher's tile choice for ``num_tokens``
    (3 tokens over K=4096: decode tiles with split K; 300: the 128x128 tiles).

    The GEMM is launched here with the launcher's arguments, not through
    ``ptpc_linear_quantized_triton``: that launcher picks its fp32 interpreter path for CPU
    tensors (DOT_FP32), and the check is about the FP8 path a GPU runs."""
    def run() -> None:
        import triton

        from atomk31.triton_kernels.ptpc_fp8 import (pick_config, ptpc_gemm_kernel,
                                                     ptpc_quantize_triton)

        out_features = 256
        a, a_scale = ptpc_quantize_triton(
            torch.randn(num_tokens, in_features, dtype=torch.bfloat16), _fp8_dtype())
        w_q = torch.zeros(out_features, in_features, dtype=_fp8_dtype())
        config = pick_config(num_tokens, out_features, in_features)
        c = torch.empty(num_tokens, out_features,
                        dtype=torch.float32 if config.split_k > 1 else torch.bfloat16)
        grid = (triton.cdiv(num_tokens, config.block_m) * triton.cdiv(out_features,
                                                                      config.block_n),
                config.split_k)
        ptpc_gemm_kernel[grid](
            a, w_q, a_scale, torch.ones(out_features), c, num_tokens, out_features,
            in_features, a.stride(0), w_q.stride(0), c.stride(0),
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            GROUP_M=config.group_m, SPLIT_K=config.split_k, DOT_FP32=False,
            PROMOTE_EVERY=config.promote_every, num_warps=config.num_warps,
            num_stages=config.num_stages)
    return run


def sparse_mla_fp16() -> None:
    """FP16 products over the FP8 cache, and the kernel that scales the queries into FP16."""
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_rows, num_heads, num_blocks, block_size = 2, 16, 4, 64
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=_fp8_dtype())
    slots = torch.randint(0, num_blocks * block_size, (num_rows, 256))
    sparse_mla_triton(torch.randn(num_rows, num_heads, 576, dtype=torch.bfloat16),
                      latent_cache, 1.0, slots, 576 ** -0.5, num_splits=2, fp16_operands=True)


def sparse_mla() -> None:
    """FP8 latent cache, 256 selected slots: two key splits, so the combine compiles too."""
    from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

    num_rows, num_heads, num_blocks, block_size = 2, 16, 4, 64
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=_fp8_dtype())
    slots = torch.randint(0, num_blocks * block_size, (num_rows, 256))
    sparse_mla_triton(torch.randn(num_rows, num_heads, 576, dtype=torch.bfloat16),
                      latent_cache, 1.0, slots, 576 ** -0.5, num_splits=2)


def sparse_mla_model_heads(num_rows: int) -> Callable[[], None]:
    """The model's decode shape: 96 heads, 2048 selected rows of an FP8 latent, with the
    launcher's own tiles (on CUDA: 16 rows take the few-row layout, 64 the value split)."""
    def run() -> None:
        from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

        num_blocks, block_size = 32, 128
        latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=_fp8_dtype())
        slots = torch.randint(0, num_blocks * block_size, (num_rows, 2048))
        sparse_mla_triton(torch.randn(num_rows, 96, 576, dtype=torch.bfloat16), latent_cache,
                          1.0, slots, 192 ** -0.5)
    return run


def dense_mla() -> None:
    from atomk31.triton_kernels.dense_mla import dense_mla_triton

    num_heads, num_blocks, block_size = 16, 2, 64
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    dense_mla_triton(torch.randn(4, num_heads, 576, dtype=torch.bfloat16), latent_cache, 1.0,
                     torch.arange(num_blocks, dtype=torch.int32)[None],
                     torch.zeros(4, dtype=torch.int32), torch.tensor([0, 70, 126, 127]),
                     block_size, 576 ** -0.5, rows_per_request=4)


def topk(with_slots: bool, collect: str | None = None, **options: object) -> Callable[[], None]:
    """Top-k of three rows (1, 3000 and 5000 long); `collect` and the launcher's `options`
    reach the non-default stage kernels."""
    def run() -> None:
        from atomk31.triton_kernels.topk import topk_triton

        num_rows, num_positions, block_size = 3, 5000, 64
        lengths = torch.tensor([1, 3000, 5000], dtype=torch.int32)
        if with_slots:
            num_blocks = (num_positions + block_size - 1) // block_size
            topk_triton(torch.randn(num_rows, num_positions), 2048, lengths,
                        torch.arange(num_blocks, dtype=torch.int32)[None],
                        torch.zeros(num_rows, dtype=torch.int32), block_size)
        else:
            if collect is not None:
                options["collect"] = collect
            topk_triton(torch.randn(num_rows, num_positions), 2048, lengths, **options)
    return run


EXAMPLES: dict[str, Callable[[], None]] = {
    "indexer_score[fp8]": indexer_score("fp8", use_fp8_dot=False),
    "indexer_score[fp8, fp8 dot]": indexer_score("fp8", use_fp8_dot=True),
    "indexer_score[mxfp4]": indexer_score("mxfp4", use_fp8_dot=False),
    "kv_write[bf16 latent, fp8 keys]": kv_write("fp8", torch.bfloat16),
    "kv_write[fp8 latent, mxfp4 keys]": kv_write("mxfp4", torch.float8_e4m3fn),
    **KDA_EXAMPLES,
    "attn_res": attn_res,
    "gated_rms_norm": gated_rms_norm,
    "gated_rms_norm_fp8": gated_rms_norm_fp8,
    "ptpc_linear[decode]": ptpc_linear(3, 4096),
    "ptpc_linear[prefill]": ptpc_linear(300, 512),
    **MOE_EXAMPLES,
    "sparse_mla[fp8 cache]": sparse_mla,
    "dense_mla": dense_mla,
    "sparse_mla[fp16 products]": sparse_mla_fp16,
    "sparse_mla[96 heads, 16 rows]": sparse_mla_model_heads(16),
    "sparse_mla[96 heads, 64 rows]": sparse_mla_model_heads(64),
    "topk": topk(with_slots=False),
    "topk[slots]": topk(with_slots=True),
    "topk[warp collect]": topk(with_slots=False, collect="warp"),
    "topk[overflow kernel]": topk(with_slots=False, fuse_overflow=False),
    "topk[fused threshold]": topk(with_slots=False, fuse_threshold=True),
    "topk[pdl]": topk(with_slots=False, pdl=True),
}
