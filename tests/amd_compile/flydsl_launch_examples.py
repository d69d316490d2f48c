"""FlyDSL launches with the engine's own tensors, for COMPILE_ONLY builds (no GPU).

Each function calls a FlyDSL launcher exactly as the engine's op table does: the arguments
shaped and strided as the model hands them over (the latent page of a `PackedLayout` pool's
`layer_view`, strided by the whole block row; the slots `topk_slots` returns for a prefill
chunk's `ForwardBatch` rows). Under
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


def prefill_slots(num_rows: int, start: int, block_size: int, k: int) -> torch.Tensor:
    """What `ops.topk_slots` hands sparse MLA for a prefill chunk of one request: rows at
    positions start .. start + num_rows - 1 (atomk31/model/mla_layer.py's arguments)."""
    from atomk31.ops.topk import topk_slots_torch

    positions = torch.arange(start, start + num_rows)
    num_blocks = -(-(start + num_rows) // block_size)
    block_tables = torch.arange(num_blocks, dtype=torch.int32)[None]
    scores = torch.randn(num_rows, start + num_rows)
    return topk_slots_torch(scores, k, positions + 1, block_tables,
                            torch.zeros(num_rows, dtype=torch.int32), block_size)


def sparse_mla_engine_view(num_rows: int = MANY_ROWS, k: int = 2048) -> None:
    """A prefill chunk's sparse MLA (the "many_rows" class) over the engine's strided
    latent view, with the slots topk_slots gives it."""
    from flydsl_kernels.sparse_mla import sparse_mla_flydsl

    block_size = 128
    latent = engine_latent_view(block_size, num_blocks=-(-(k + num_rows) // block_size))
    slots = prefill_slots(num_rows, k, block_size, k)
    assert slots.dtype == torch.int32 and slots.shape == (num_rows, k)
    q = torch.randn(num_rows, NUM_HEADS, 576).to(torch.bfloat16)
    sparse_mla_flydsl(q, latent, 1.0, slots, 192 ** -0.5)
