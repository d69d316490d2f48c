"""The KDA launch examples of triton_launch_examples.py (decode, verify, prefill and its tuning
variants, the short convolution): one small CPU-tensor launch each, at K3.1's head size, per
size case (sizes.py: requests, tokens, verification rows and sequence lengths)."""

from collections.abc import Callable
from dataclasses import replace

import torch
from sizes import Sizes, sized

KDA_HEADS = 2
HEAD_DIM = 128


def _kda_inputs(shape: tuple[int, ...],
                dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(*shape, HEAD_DIM, dtype=dtype) for _ in range(3))
    g = -torch.rand(*shape, HEAD_DIM)
    beta = torch.rand(*shape)
    return q, k, v, g, beta


def kda_decode(s: Sizes) -> None:
    from atomk31.triton_kernels.kda_decode import kda_decode_triton

    requests = s(3)
    q, k, v, g, beta = _kda_inputs((requests, KDA_HEADS))
    kda_decode_triton(q, k, v, g, beta, torch.zeros(requests, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                      HEAD_DIM ** -0.5)


def kda_verify(s: Sizes) -> None:
    from atomk31.triton_kernels.kda_decode import kda_verify_triton

    requests, rows = s(2), s(4)
    q, k, v, g, beta = _kda_inputs((requests, rows, KDA_HEADS))
    kda_verify_triton(q, k, v, g, beta, torch.zeros(requests, KDA_HEADS, HEAD_DIM, HEAD_DIM),
                      HEAD_DIM ** -0.5)


def _prefill_batch(s: Sizes) -> tuple[list[int], torch.Tensor]:
    """Request lengths (70 and 30 tokens unaligned) and a snapshot inside the first."""
    lengths = [s(70), s(30)][:s(2)]
    return lengths, torch.tensor([[0, s(63)]])


def kda_prefill(dtype: torch.dtype = torch.bfloat16, snapshots: bool = True,
                **knobs: object) -> Callable[[Sizes], None]:
    """The launcher's default path for ``dtype`` (CUDA: BF16 takes the folded wide stage 1,
    float32 the exact single kernel), or, with tuning ``knobs``, the BF16 prefill with the
    split intra stage (``intra_split``) and those knobs set; without ``snapshots`` (the device-built chunk
    table only serves prefills that take none)."""
    def run(s: Sizes) -> None:
        from atomk31.triton_kernels.kda_prefill import default_tuning, kda_prefill_triton

        lengths, snapshot_at = _prefill_batch(s)
        q, k, v, g, beta = _kda_inputs((sum(lengths), KDA_HEADS), dtype)
        tuning = replace(default_tuning(q.dtype), intra_split=True, **knobs) if knobs else None
        cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        kda_prefill_triton(q, k, v, g, beta,
                           torch.zeros(len(lengths), KDA_HEADS, HEAD_DIM, HEAD_DIM), cu_seqlens,
                           HEAD_DIM ** -0.5, snapshot_at=snapshot_at if snapshots else None,
                           tuning=tuning)
    return run


def short_conv(s: Sizes) -> None:
    from atomk31.triton_kernels.kda_conv import conv_state_after_triton, short_conv_silu_triton

    channels, width = 256, 4
    lengths = [s(4), s(5)][:s(2)]
    z = torch.randn(sum(lengths), channels, dtype=torch.bfloat16)
    conv_state = torch.zeros(len(lengths), width - 1, channels, dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    has_initial_state = torch.tensor([True, False][:len(lengths)])
    short_conv_silu_triton(z, torch.randn(channels, width), conv_state, cu_seqlens,
                           has_initial_state)
    snapshot_rows = [[r, min(2 + 3 * r, length)] for r, length in enumerate(lengths)]
    conv_state_after_triton(z, conv_state, cu_seqlens, has_initial_state,
                            torch.tensor(snapshot_rows))


_WIDE = dict(scores_num_warps=4, compact_scores=True)

KDA_EXAMPLES: dict[str, Callable[[], None]] = {
    **sized("kda_decode", kda_decode),
    **sized("kda_verify", kda_verify),
    **sized("kda_prefill", kda_prefill()),
    **sized("kda_prefill[float32]", kda_prefill(torch.float32)),
    # stage 1a variants: [64, 64] accumulators per slice then the gated w/u (stage 1b), or one
    # product per slice with the four blocks joined
    **sized("kda_prefill[wide scores]", kda_prefill(scores_block_k=32, fold_w_u=False,
                                                    scores_bf16=False, **_WIDE)),
    **sized("kda_prefill[wide joined scores]", kda_prefill(scores_joined=True,
                                                           scores_block_k=16, **_WIDE)),
    # the chunk table built on the GPU (no snapshots)
    **sized("kda_prefill[device plan]", kda_prefill(snapshots=False, scores_block_k=32,
                                                    plan_on_device=True, **_WIDE)),
    # w and u folded into the state stage (stage 1a also writes the gated rows)
    **sized("kda_prefill[folded w/u]", kda_prefill(snapshots=False, scores_block_k=32,
                                                   plan_on_device=True, fold_w_u=True,
                                                   **_WIDE)),
    **sized("short_conv", short_conv),
}
