"""The MoE launch examples of triton_launch_examples.py (routing, the grouped GEMMs, the
small-batch GEMVs): one small CPU-tensor launch each, BF16 activations, 4 experts of 256."""

from collections.abc import Callable

import torch


def _compiling_for_gfx942() -> bool:
    """gfx942 has no scaled MFMA (and runs e4m3fnuz, §6.1)."""
    from triton.runtime.driver import driver

    return driver.active.get_current_target().arch == "gfx942"


def _mxfp4_experts(num_experts: int = 4, intermediate_size: int = 256,
                   latent_size: int = 256) -> tuple[torch.Tensor, ...]:
    """Zero MXFP4 weights with unit scales: w13, w13_scales, w2, w2_scales."""
    w13 = torch.zeros(num_experts, 2 * intermediate_size, latent_size // 2, dtype=torch.uint8)
    w13_scales = torch.full((num_experts, 2 * intermediate_size, latent_size // 32), 127,
                            dtype=torch.uint8)
    w2 = torch.zeros(num_experts, latent_size, intermediate_size // 2, dtype=torch.uint8)
    w2_scales = torch.full((num_experts, latent_size, intermediate_size // 32), 127,
                           dtype=torch.uint8)
    return w13, w13_scales, w2, w2_scales


def moe_route_split() -> None:
    """The router logits spread over E/4 programs per token (``split_router``)."""
    from atomk31.triton_kernels.moe_routing import moe_route_triton

    num_experts, hidden_size = 64, 256
    moe_route_triton(torch.randn(4, hidden_size, dtype=torch.bfloat16),
                     torch.randn(num_experts, hidden_size), torch.zeros(num_experts), 8,
                     True, 2.5, split_router=True)


def moe_route() -> None:
    from atomk31.triton_kernels.moe_routing import moe_route_triton

    num_experts, hidden_size = 64, 256
    moe_route_triton(torch.randn(4, hidden_size, dtype=torch.bfloat16),
                     torch.randn(num_experts, hidden_size), torch.zeros(num_experts), 8,
                     True, 2.5)


def moe_experts(use_dot_scaled: bool, fp8_down: bool = False) -> Callable[[], None]:
    """Both grouped GEMMs with the arguments of ``moe_experts_mxfp4_triton`` (launched here:
    that launcher takes its fp32 interpreter path for CPU tensors). The dot_scaled path only
    where MX tensor cores exist (gfx950); fp8_down: h in MXFP8 (e4m3fn + E8M0) for the down
    GEMM (issue #6)."""
    def run() -> None:
        import triton

        from atomk31.triton_kernels.moe_grouped_gemm import (moe_down_kernel,
                                                             moe_gate_up_kernel, pick_block_m)
        from atomk31.triton_kernels.moe_routing import sort_pairs_by_expert

        if use_dot_scaled and _compiling_for_gfx942():
            return  # gfx942 has no scaled MFMA
        num_experts, intermediate_size, latent_size, top_k = 4, 256, 256, 2
        topk_ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], dtype=torch.int32)
        num_tokens, num_pairs = topk_ids.shape[0], topk_ids.numel()
        block_m, block_n, block_k = pick_block_m(num_pairs, num_experts), 64, 128
        w13, w13_scales, w2, w2_scales = _mxfp4_experts(num_experts, intermediate_size,
                                                        latent_size)
        z = torch.randn(num_tokens, latent_size, dtype=torch.bfloat16)
        blocks = sort_pairs_by_expert(topk_ids, num_experts, block_m)
        num_rows = blocks.num_blocks_max * block_m
        hidden = torch.empty(num_rows, intermediate_size,
                             dtype=torch.float8_e4m3fn if fp8_down else z.dtype)
        hidden_scales = torch.empty(num_rows, intermediate_size // 32, dtype=torch.uint8) \
            if fp8_down else hidden
        u = torch.zeros(num_tokens, latent_size)
        meta = dict(E=num_experts, F=intermediate_size, DL=latent_size, TOP_K=top_k,
                    BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                    USE_DOT_SCALED=use_dot_scaled, DOT_FP32=False, FP8_DOWN=fp8_down,
                    num_warps=4, num_stages=3)
        moe_gate_up_kernel[(blocks.num_blocks_max, triton.cdiv(intermediate_size, block_n))](
            z, blocks.pair_ids, blocks.block_expert, w13, w13_scales, hidden, hidden_scales,
            num_pairs, z.stride(0), 10.0, 10.0, HAS_LINEAR_CAP=True, **meta)
        moe_down_kernel[(blocks.num_blocks_max, triton.cdiv(latent_size, block_n))](
            hidden, hidden_scales, blocks.pair_ids, blocks.block_expert, w2, w2_scales,
            torch.rand(num_tokens, top_k), u, num_pairs, **meta)
    return run


def moe_experts_gemv(mode: str | None, num_tokens: int = 3, gather_rows: bool = False,
                     one_factor_exact: bool = False) -> Callable[[], None]:
    """Both small-batch GEMVs of ``moe_gemv.py`` through their launcher, BF16 activations
    (mode None: the launcher's choice, which at one token is one program per routed slot;
    ``gather_rows``: each program's rows are the tokens routed to its expert;
    ``one_factor_exact``: the weights' scale bytes allow the one-multiply nibble decode)."""
    def run() -> None:
        from atomk31.triton_kernels.moe_gemv import moe_experts_mxfp4_gemv_triton

        num_experts, intermediate_size, latent_size = 4, 256, 256
        topk_ids = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)[:num_tokens]
        w13, w13_scales, w2, w2_scales = _mxfp4_experts(num_experts, intermediate_size,
                                                        latent_size)
        z = torch.randn(topk_ids.shape[0], latent_size, dtype=torch.bfloat16)
        moe_experts_mxfp4_gemv_triton(z, torch.rand(topk_ids.shape), topk_ids, w13, w13_scales,
                                      w2, w2_scales, 10.0, 10.0, mode=mode,
                                      gather_rows=gather_rows,
                                      one_factor_exact=one_factor_exact)
    return run


def moe_experts_grouped_words(scales_ahead: bool) -> Callable[[], None]:
    """The word-decode grouped GEMMs (moe_grouped_words.py) through the grouped launcher, with
    the one-multiply decode (weights whose scale bytes allow it); ``scales_ahead`` (the
    default): each K step's scale bytes loaded a step early. 64-row tiles, 2 stages: the
    128-row 3-stage tile needs 69.6 KB of LDS, over the AMD 64 KB limit."""
    def run() -> None:
        from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_triton

        topk_ids = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 2]], dtype=torch.int32)
        z = torch.randn(topk_ids.shape[0], 256, dtype=torch.bfloat16)
        moe_experts_mxfp4_triton(z, torch.rand(topk_ids.shape), topk_ids, *_mxfp4_experts(),
                                 10.0, 10.0, small_batch=False, words=True, block_m=64,
                                 block_n=64, block_k=128, num_stages=2, one_factor_exact=True,
                                 scales_ahead=scales_ahead)
    return run


MOE_EXAMPLES: dict[str, Callable[[], None]] = {
    "moe_route": moe_route,
    "moe_route[split]": moe_route_split,
    "moe_experts_mxfp4": moe_experts(use_dot_scaled=False),
    "moe_experts_mxfp4[dot_scaled]": moe_experts(use_dot_scaled=True),
    "moe_experts_mxfp4[dot_scaled, fp8 down]": moe_experts(use_dot_scaled=True, fp8_down=True),
    "moe_experts_mxfp4[gemv fma]": moe_experts_gemv("fma"),
    "moe_experts_mxfp4[gemv fma_words]": moe_experts_gemv("fma_words"),
    "moe_experts_mxfp4[gemv dot]": moe_experts_gemv("dot"),
    "moe_experts_mxfp4[gemv dot_scaled]": moe_experts_gemv("dot_scaled"),
    "moe_experts_mxfp4[gemv fma_f32]": moe_experts_gemv("fma_f32"),
    "moe_experts_mxfp4[gemv dot_t]": moe_experts_gemv("dot_t"),
    "moe_experts_mxfp4[gemv dot_t_words]": moe_experts_gemv("dot_t_words"),
    "moe_experts_mxfp4[gemv gathered rows]": moe_experts_gemv("dot_t_words", gather_rows=True),
    "moe_experts_mxfp4[gemv 1 token]": moe_experts_gemv(None, num_tokens=1),
    "moe_experts_mxfp4[gemv words one factor]": moe_experts_gemv("dot_t_words",
                                                                 one_factor_exact=True),
    "moe_experts_mxfp4[grouped words]": moe_experts_grouped_words(scales_ahead=True),
    "moe_experts_mxfp4[grouped words, scales in step]": moe_experts_grouped_words(False),
}
