"""The KDA launch examples of triton_launch_examples.py (decode, verify, prefill and its tuning
variants, the short convolution): one small CPU-tensor launch each, at K3.1's head size."""

from collections.abc import Callable

import torch

KDA_HEADS = 2
HEAD_DIM = 128


def _kda_inputs(shape: tuple[int, ...],
                dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(*shape, HEAD_DIM, dtype=dtype) for _ in range(3))
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


def kda_prefill(dtype: torch.dtype = torch.bfloat16) -> Callable[[], None]:
    """The launcher's default path for ``dtype`` (CUDA: BF16 takes the two-kernel intra stage,
    float32 the exact single kernel)."""
    def run() -> None:
        _kda_prefill(dtype)
    return run


def _kda_prefill(dtype: torch.dtype) -> None:
    from atomk31.triton_kernels.kda_prefill import kda_prefill_triton

    q, k, v, g, beta = _kda_inputs((100, KDA_HEADS), dtype)
    kda_prefill_triton(q, k, v, g, beta, torch.zeros(2, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                       torch.tensor([0, 70, 100], dtype=torch.int32), HEAD_DIM ** -0.5,
                       snapshot_at=torch.tensor([[0, 64]]))


def kda_prefill_tuned(snapshots: bool = True, **knobs) -> Callable[[], None]:
    """The BF16 prefill with the two-kernel intra stage and the tuning ``knobs`` set; without
    ``snapshots`` (the device-built chunk table only serves prefills that take none)."""
    def run() -> None:
        from dataclasses import replace

        from atomk31.triton_kernels.kda_prefill import default_tuning, kda_prefill_triton

        q, k, v, g, beta = _kda_inputs((100, KDA_HEADS))
        kda_prefill_triton(q, k, v, g, beta, torch.zeros(2, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                           torch.tensor([0, 70, 100], dtype=torch.int32), HEAD_DIM ** -0.5,
                           snapshot_at=torch.tensor([[0, 64]]) if snapshots else None,
                           tuning=replace(default_tuning(q.dtype), intra_split=True, **knobs))
    return run


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


_WIDE = dict(scores_wide=True, scores_num_warps=4, compact_scores=True)

KDA_EXAMPLES: dict[str, Callable[[], None]] = {
    "kda_decode": kda_decode,
    "kda_verify": kda_verify,
    "kda_prefill": kda_prefill(),
    "kda_prefill[float32]": kda_prefill(torch.float32),
    # stage 1a variants: scores + inverse then gated w/u; [64, 16] column blocks; [64, 64]
    # accumulators per slice, or one product per slice with the four blocks joined
    "kda_prefill[two-kernel intra]": kda_prefill_tuned(scores_wide=False, scores_block_k=16,
                                                       scores_num_warps=2),
    "kda_prefill[column-block scores]": kda_prefill_tuned(scores_columns=True),
    "kda_prefill[wide scores]": kda_prefill_tuned(scores_block_k=32, fold_w_u=False,
                                                  scores_bf16=False, **_WIDE),
    "kda_prefill[wide joined scores]": kda_prefill_tuned(scores_joined=True, scores_block_k=16,
                                                         **_WIDE),
    # the chunk table built on the GPU (no snapshots)
    "kda_prefill[device plan]": kda_prefill_tuned(snapshots=False, scores_block_k=32,
                                                  plan_on_device=True, **_WIDE),
    # w and u folded into the state stage (stage 1a also writes the gated rows)
    "kda_prefill[folded w/u]": kda_prefill_tuned(snapshots=False, scores_block_k=32,
                                                 plan_on_device=True, fold_w_u=True, **_WIDE),
    "short_conv": short_conv,
}
