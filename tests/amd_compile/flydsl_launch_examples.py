"""FlyDSL launches with the engine's own tensors, for COMPILE_ONLY builds (no GPU).

Each function calls a FlyDSL launcher exactly as the engine's op table does: the arguments
shaped and strided as the model hands them over (the latent page of a `PackedLayout` pool's
`layer_view`, strided by the whole block row; the slots `topk_slots` returns). Under
FlyDSL's COMPILE_ONLY=1 the launch compiles the kernel for ARCH and runs nothing
(compile_flydsl_kernel.py starts one in a subprocess with that environment).
"""

import torch

from atomk31.cache.layout import CacheLayoutSpec, PackedLayout

NUM_HEADS = 96  # K3.1's attention heads (MODEL_SPEC §2)
MANY_ROWS = 256  # sparse_mla's "many_rows" shape class starts here (atomk31/ops/sparse_mla.py)


def engine_latent_view(block_size: int = 128, num_blocks: int = 9) -> torch.Tensor:
    """Layer 1's latent page of a 3-layer FP8 pool: [num_blocks, block_size, 576] e4m3fn with
    the block stride of the whole packed row, never contiguous."""
    layout = PackedLayout(CacheLayoutSpec(block_size=block_size, num_mla_layers=3))
    latent = layout.layer_view(layout.allocate(num_blocks, "cpu"), 1).latent
    assert not latent.is_contiguous() and latent.stride(0) == layout.row_bytes
    return latent


def sparse_mla_engine_view(num_rows: int = MANY_ROWS, k: int = 2048) -> None:
    """A prefill chunk's sparse MLA over the engine's strided latent view."""
    from flydsl_kernels.sparse_mla import sparse_mla_flydsl

    latent = engine_latent_view()
    num_slots = latent.shape[0] * latent.shape[1]
    slots = torch.randint(-1, num_slots, (num_rows, k), dtype=torch.int32)
    q = torch.randn(num_rows, NUM_HEADS, 576).to(torch.bfloat16)
    sparse_mla_flydsl(q, latent, 1.0, slots, 192 ** -0.5)
