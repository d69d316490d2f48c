"""Small launches of every Triton launcher, so every kernel of atomk31/triton_kernels compiles.

Each example calls a launcher of atomk31/triton_kernels with CPU tensors shaped by the op's
contract (atomk31/ops/) at K3.1's per-head sizes (128-wide keys and values, 576-wide latent
rows, 32 indexer heads), once per size case (sizes.py: every run-time size 1, every one a
multiple of 16, none of either; "<name>@<case>"). capture_triton_isa.py runs them under a
compile-only driver, so the kernels compile for gfx950 / gfx942 / sm_90 exactly as a launch on
that GPU would, Triton's specialization of the int arguments included; nothing executes.

A new launcher needs one entry here; test_triton_compile.py fails, naming the kernel, when a
`*_kernel` of atomk31/triton_kernels is reached by no example.
"""

import importlib
import pkgutil
from collections.abc import Callable

import torch
from kda_launch_examples import HEAD_DIM, KDA_EXAMPLES, KDA_HEADS
from moe_launch_examples import MOE_EXAMPLES
from sizes import Sizes, sized

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


def indexer_score(index_format: str) -> Callable[[Sizes], None]:
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.indexer_score import indexer_score_triton

        block_size, num_rows, num_blocks = 64, s(8), s(4)
        values, scales = _index_cache(index_format, num_blocks, block_size)
        block_table = torch.arange(num_blocks, dtype=torch.int32)[None]
        indexer_score_triton(
            torch.randn(num_rows, NUM_INDEX_HEADS, 128), torch.randn(num_rows, NUM_INDEX_HEADS),
            values, scales, index_format, _fp8_variant(), block_table,
            torch.zeros(num_rows, dtype=torch.int32),
            torch.arange(s(200) - 1, s(200) - 1 + num_rows), block_size)
    return run


def kv_write(index_format: str, latent_dtype: torch.dtype) -> Callable[[Sizes], None]:
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.kv_write import kv_write_triton

        num_blocks, block_size, num_tokens = s(2), 16, s(5)
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


def attn_res(s: Sizes) -> None:
    from atomk31.triton_kernels.attn_res import attn_res_triton

    hidden_size = 7168  # the model's D (§2): one program holds a whole row
    attn_res_triton(torch.randn(s(3), s(5), hidden_size, dtype=torch.bfloat16),
                    torch.randn(hidden_size), torch.randn(hidden_size), 1e-6)


def gated_rms_norm(s: Sizes) -> None:
    from atomk31.triton_kernels.gated_rms_norm import gated_rms_norm_triton

    x, gate = (torch.randn(s(5), KDA_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    gated_rms_norm_triton(x, gate, torch.randn(HEAD_DIM), 1e-6)


def ptpc_linear(num_tokens: int, in_features: int) -> Callable[[Sizes], None]:
    """The quantizer, then the pointer GEMM with its tile choice for ``num_tokens`` (3 tokens
    over K=4096: decode tiles with split K; 300: the 128x128 tiles)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.ptpc_fp8 import ptpc_linear_triton
        from atomk31.quant.ptpc import quantize_weight_ptpc

        w_q, w_scale = quantize_weight_ptpc(torch.randn(256, in_features), _fp8_variant())
        ptpc_linear_triton(torch.randn(s(num_tokens), in_features, dtype=torch.bfloat16), w_q,
                           w_scale)
    return run


def sparse_mla(fp16_operands: bool = False) -> Callable[[Sizes], None]:
    """FP8 latent cache, 256 selected slots: two key splits, so the combine compiles too
    (``fp16_operands``: FP16 products over the FP8 cache, and the kernel that scales the
    queries into FP16)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.mla_tiles import MLATileConfig
        from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

        num_rows, num_heads, num_blocks, block_size = s(2), 16, s(4), 64
        latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=_fp8_dtype())
        slots = torch.randint(0, num_blocks * block_size, (num_rows, 256))
        sparse_mla_triton(torch.randn(num_rows, num_heads, 576, dtype=torch.bfloat16),
                          latent_cache, 1.0, slots, 576 ** -0.5,
                          MLATileConfig(num_splits=2, fp16_operands=fp16_operands))
    return run


def sparse_mla_model_heads(num_rows: int) -> Callable[[Sizes], None]:
    """The model's decode shape: 96 heads, 2048 selected rows of an FP8 latent, with the
    launcher's own tiles (on CUDA: 16 rows take the few-row layout, 64 the value split: the
    rows pick the layout, so only the cache's block count follows the size case)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.sparse_mla import sparse_mla_triton

        num_blocks, block_size = s(31), 128
        latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=_fp8_dtype())
        slots = torch.randint(0, num_blocks * block_size, (num_rows, 2048))
        sparse_mla_triton(torch.randn(num_rows, 96, 576, dtype=torch.bfloat16), latent_cache,
                          1.0, slots, 192 ** -0.5)
    return run


def dense_mla(s: Sizes) -> None:
    """Requests of 4 verification rows each over a BF16 cache."""
    from atomk31.triton_kernels.dense_mla import dense_mla_triton

    num_heads, num_blocks, block_size, requests = 16, s(3), 64, s(2)
    latent_cache = torch.zeros(num_blocks, block_size, 576, dtype=torch.bfloat16)
    last = max(s(100) - 4, 0)
    positions = torch.tensor([last + i for _ in range(requests) for i in range(4)])
    dense_mla_triton(torch.randn(4 * requests, num_heads, 576, dtype=torch.bfloat16),
                     latent_cache, 1.0,
                     torch.arange(num_blocks, dtype=torch.int32)[None].repeat(requests, 1),
                     torch.arange(requests, dtype=torch.int32).repeat_interleave(4), positions,
                     block_size, 576 ** -0.5, rows_per_request=4)


def topk(with_slots: bool, **options: object) -> Callable[[Sizes], None]:
    """Top-2048 of rows from 1 position long to the full width (3 rows of up to 5000 unaligned);
    the config `options` reach the non-default stage kernels."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.topk import topk_triton
        from atomk31.triton_kernels.topk_config import TopkConfig

        num_rows, num_positions, block_size = s(3), s(5000), 64
        lengths = torch.tensor([max(1, num_positions * r // max(num_rows - 1, 1))
                                for r in range(num_rows)], dtype=torch.int32)
        lengths[-1] = num_positions
        if with_slots:
            num_blocks = (num_positions + block_size - 1) // block_size
            topk_triton(torch.randn(num_rows, num_positions), 2048, lengths,
                        torch.arange(num_blocks, dtype=torch.int32)[None],
                        torch.zeros(num_rows, dtype=torch.int32), block_size)
        else:
            topk_triton(torch.randn(num_rows, num_positions), 2048, lengths,
                        config=TopkConfig(**options))
    return run


EXAMPLES: dict[str, Callable[[], None]] = {
    **sized("indexer_score[fp8]", indexer_score("fp8")),
    **sized("indexer_score[mxfp4]", indexer_score("mxfp4")),
    **sized("kv_write[bf16 latent, fp8 keys]", kv_write("fp8", torch.bfloat16)),
    **sized("kv_write[fp8 latent, mxfp4 keys]", kv_write("mxfp4", torch.float8_e4m3fn)),
    **KDA_EXAMPLES,
    **sized("attn_res", attn_res),
    **sized("gated_rms_norm", gated_rms_norm),
    **sized("ptpc_linear[decode]", ptpc_linear(3, 4096)),
    **sized("ptpc_linear[prefill]", ptpc_linear(300, 512)),
    **MOE_EXAMPLES,
    **sized("sparse_mla[fp8 cache]", sparse_mla()),
    **sized("dense_mla", dense_mla),
    **sized("sparse_mla[fp16 products]", sparse_mla(fp16_operands=True)),
    **sized("sparse_mla[96 heads, 16 rows]", sparse_mla_model_heads(16)),
    **sized("sparse_mla[96 heads, 64 rows]", sparse_mla_model_heads(64)),
    **sized("topk", topk(with_slots=False)),
    **sized("topk[slots]", topk(with_slots=True)),
    **sized("topk[overflow kernel]", topk(with_slots=False, fuse_overflow=False)),
    **sized("topk[fused threshold]", topk(with_slots=False, fuse_threshold=True)),
}
