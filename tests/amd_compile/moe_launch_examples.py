"""The MoE launch examples of triton_launch_examples.py (routing, the grouped GEMMs, the
small-batch GEMVs): one small CPU-tensor launch each, BF16 activations, 4 experts of 256, per
size case (sizes.py: the token count)."""

from collections.abc import Callable

import torch
from sizes import Sizes, sized


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


def _routed(num_tokens: int, top_k: int = 2, num_experts: int = 4):
    """z [T, 256] BF16 and top-k routing over distinct experts per token."""
    ids = (torch.arange(num_tokens)[:, None] + torch.arange(top_k)[None]) % num_experts
    return (torch.randn(num_tokens, 256, dtype=torch.bfloat16), torch.rand(num_tokens, top_k),
            ids.to(torch.int32))


def moe_route(logits: str) -> Callable[[Sizes], None]:
    """Routing with the logits formed ``logits`` way (moe_routing.RouteConfig)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.moe_routing import RouteConfig, moe_route_triton

        num_experts, hidden_size = 64, 256
        moe_route_triton(torch.randn(s(4), hidden_size, dtype=torch.bfloat16),
                         torch.randn(num_experts, hidden_size), torch.zeros(num_experts), 8,
                         True, 2.5, RouteConfig(logits))
    return run


def moe_experts_grouped(s: Sizes) -> None:
    """The byte-decode grouped GEMMs through their launcher."""
    from atomk31.triton_kernels.moe_grouped_gemm import moe_experts_mxfp4_grouped_triton

    moe_experts_mxfp4_grouped_triton(*_routed(s(5)), *_mxfp4_experts(), 10.0, 10.0)


def moe_experts_grouped_words(s: Sizes) -> None:
    """The word-decode grouped GEMMs (moe_grouped_words.py) through their launcher, with the
    one-multiply decode. 64-row tiles, 2 stages: the 128-row 3-stage tile needs 69.6 KB of
    LDS, over the AMD 64 KB limit."""
    from atomk31.triton_kernels.moe_grouped_gemm import GroupedConfig
    from atomk31.triton_kernels.moe_grouped_words import moe_experts_mxfp4_grouped_words_triton

    moe_experts_mxfp4_grouped_words_triton(*_routed(s(5)), *_mxfp4_experts(), 10.0, 10.0,
                                           one_factor_exact=True,
                                           config=GroupedConfig(64, 64, 128, 4, num_stages=2))


def moe_experts_gemv(mode: str | None, num_tokens: int = 3, gather_rows: bool | None = None,
                     one_factor_exact: bool = False) -> Callable[[Sizes], None]:
    """Both small-batch GEMVs of ``moe_gemv.py`` through their launcher, BF16 activations
    (mode None: the portable launcher's choice, "fma" at one token; ``gather_rows``: each
    program's rows are the tokens routed to its expert; ``one_factor_exact``: the weights'
    scale bytes allow the one-multiply nibble decode)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.moe_gemv import GemvConfig, moe_experts_mxfp4_gemv_triton

        moe_experts_mxfp4_gemv_triton(*_routed(s(num_tokens)), *_mxfp4_experts(), 10.0, 10.0,
                                      one_factor_exact=one_factor_exact,
                                      config=GemvConfig(mode=mode, gather_rows=gather_rows))
    return run


MOE_EXAMPLES: dict[str, Callable[[], None]] = {
    **sized("moe_route", moe_route("fused")),
    **sized("moe_route[split]", moe_route("split")),
    **sized("moe_route[gemm]", moe_route("gemm")),
    **sized("moe_experts_mxfp4[grouped]", moe_experts_grouped),
    **sized("moe_experts_mxfp4[grouped words]", moe_experts_grouped_words),
    **sized("moe_experts_mxfp4[gemv]", moe_experts_gemv(None)),
    **sized("moe_experts_mxfp4[gemv dot_t]", moe_experts_gemv("dot_t")),
    **sized("moe_experts_mxfp4[gemv words]", moe_experts_gemv("dot_t_words")),
    **sized("moe_experts_mxfp4[gemv gathered rows]", moe_experts_gemv("dot_t_words", 17,
                                                                      gather_rows=True)),
    **sized("moe_experts_mxfp4[gemv words one factor]",
            moe_experts_gemv("dot_t_words", one_factor_exact=True)),
}
