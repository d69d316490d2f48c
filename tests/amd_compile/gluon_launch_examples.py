"""Launches of every Gluon kernel with the engine's own tensors, for compile-only runs (no GPU).

Each example calls a Gluon launcher exactly as the engine's op table does: a `ForwardBatch`'s
rows (int32 requests, int64 positions, an int32 block table padded with -1), one layer's
pages of a `PackedLayout` pool (`layer_view`: every page strided by the whole packed block
row), the slots `topk_slots` hands sparse MLA. capture_gluon_launches.py runs them under the
compile-only driver of capture_triton_isa.py, so each `kernel[grid](...)` specializes its
arguments as a real launch would and compiles for the target; nothing executes.

Triton passes an integer argument equal to 1 as a constant, and one divisible by 16 with that
promise: each kernel is launched at three batch sizes (`SIZES`) so that every size and stride
argument takes each form at least once: "1" (one request, one row, one key, one head where
heads are an argument: the crash of issue 16, a `.to()` on a constant), "16" (16 requests,
256 keys: multiples of 16) and "17" (17 requests, 33 keys: odd).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from atomk31.cache.layout import CacheLayoutSpec, MLACacheView, PackedLayout
from atomk31.model.batch import ForwardBatch

INDEX_HEADS = 32  # H_I (MODEL_SPEC §2)
ATTENTION_HEADS = 96
INDEX_TOPK = 2048


@dataclass(frozen=True)
class Sizes:
    """A decode batch: `requests` rows, each at position context - 1, over `heads` heads."""

    requests: int
    context: int
    heads: int | None = None  # None: the model's


SIZES = {"1": Sizes(1, 1, heads=1), "16": Sizes(16, 256), "17": Sizes(17, 33)}


def active_arch() -> str:
    from triton.runtime import driver

    target = driver.active.get_current_target()
    return f"sm{target.arch}" if target.backend == "cuda" else str(target.arch)


def decode_batch(sizes: Sizes, block_size: int) -> ForwardBatch:
    """A decode step as the model runner builds it: request r at position context - 1, its
    blocks r * blocks_per_request.. (the table as wide as the longest request's blocks)."""
    n, context = sizes.requests, sizes.context
    blocks = -(-context // block_size)
    table = torch.arange(n * blocks, dtype=torch.int32).view(n, blocks)
    positions = torch.full((n,), context - 1, dtype=torch.int64)
    slots = table[:, -1].long() * block_size + (context - 1) % block_size
    return ForwardBatch(
        input_ids=torch.zeros(n, dtype=torch.int64), positions=positions,
        token_request=torch.arange(n, dtype=torch.int32),
        cu_seqlens=torch.arange(n + 1, dtype=torch.int32), block_tables=table,
        slot_mapping=slots, state_slots=torch.zeros(n, dtype=torch.int64),
        has_initial_state=torch.ones(n, dtype=torch.bool),
        logits_indices=torch.arange(n, dtype=torch.int64),
        snapshots=torch.zeros(0, 3, dtype=torch.int64), block_size=block_size,
        max_position=context - 1, is_decode_only=True, rows_per_request=1)


def layer_cache(batch: ForwardBatch, index_format: str = "fp8") -> MLACacheView:
    """Layer 1's pages of a 2-layer pool holding every block of the batch (the FP8 variant of
    the architecture compiled for: e4m3fnuz on gfx942, §6.1)."""
    variant = "e4m3fnuz" if active_arch() == "gfx942" else "e4m3fn"
    latent = torch.float8_e4m3fnuz if variant == "e4m3fnuz" else torch.float8_e4m3fn
    layout = PackedLayout(CacheLayoutSpec(block_size=batch.block_size, num_mla_layers=2,
                                          latent_dtype=latent, index_format=index_format,
                                          fp8_variant=variant))
    num_blocks = int(batch.block_tables.max()) + 1
    return layout.layer_view(layout.allocate(num_blocks, "cpu"), 1)


def indexer_inputs(sizes: Sizes, index_format: str, block_size: int):
    """The model's `ops.indexer_score(...)` arguments (atomk31/model/mla_layer.py)."""
    batch = decode_batch(sizes, block_size)
    cache = layer_cache(batch, index_format)
    heads = sizes.heads or INDEX_HEADS
    q = torch.randn(batch.positions.numel(), heads, 128).to(torch.bfloat16)
    weights = torch.randn(batch.positions.numel(), heads)
    variant = "e4m3fnuz" if active_arch() == "gfx942" else "e4m3fn"
    return ((q, weights, cache.index_values, cache.index_scales, index_format, variant,
             batch.block_tables, batch.token_request, batch.positions, batch.block_size),
            {"num_positions": batch.max_position + 1})


def topk_inputs(sizes: Sizes, block_size: int = 64):
    """The model's `ops.topk_slots(...)` arguments."""
    batch = decode_batch(sizes, block_size)
    scores = torch.randn(batch.positions.numel(), batch.max_position + 1)
    k = min(INDEX_TOPK, batch.max_position + 1)
    return (scores, k, batch.positions + 1, batch.block_tables, batch.token_request,
            batch.block_size)


def mla_inputs(sizes: Sizes, block_size: int = 64):
    """(batch, q_abs, the layer's cache, the slots topk_slots would give) of a decode step."""
    batch = decode_batch(sizes, block_size)
    cache = layer_cache(batch)
    q = torch.randn(batch.positions.numel(), sizes.heads or ATTENTION_HEADS,
                    576).to(torch.bfloat16)
    k = min(INDEX_TOPK, batch.max_position + 1)
    positions = torch.arange(k)[None].expand(batch.positions.numel(), k)
    columns = batch.block_tables.long()[batch.token_request.long()[:, None],
                                        positions // block_size]
    slots = (columns * block_size + positions % block_size).to(torch.int32)
    return batch, q, cache, slots


def amd_indexer(index_format: str, sizes: Sizes) -> Callable[[], None]:
    def run() -> None:
        from gluon_kernels.amd.indexer_score import indexer_score_gluon

        if index_format == "mxfp4" and active_arch() == "gfx942":
            return  # no FP4 there (§4.6.1): the registry keeps fp8 keys on gfx942
        args, kwargs = indexer_inputs(sizes, index_format, block_size=64)
        indexer_score_gluon(*args, **kwargs)
    return run


def amd_topk_slots(sizes: Sizes) -> Callable[[], None]:
    def run() -> None:
        from atomk31.ops.amd_adapters import topk_slots_radix

        topk_slots_radix(*topk_inputs(sizes))
    return run


def hopper_only(launch: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        if active_arch() == "sm90":
            launch()
    return run


def hopper_indexer(sizes: Sizes) -> Callable[[], None]:
    def run() -> None:
        from gluon_kernels.hopper.indexer_score import indexer_score_hopper

        args, kwargs = indexer_inputs(sizes, "fp8", block_size=64)
        indexer_score_hopper(*args, **kwargs)
    return hopper_only(run)


def hopper_sparse_mla(sizes: Sizes) -> Callable[[], None]:
    def run() -> None:
        from gluon_kernels.hopper.sparse_mla import sparse_mla_hopper

        _, q, cache, slots = mla_inputs(sizes)
        sparse_mla_hopper(q, cache.latent, cache.latent_scale, slots, 192 ** -0.5)
    return hopper_only(run)


def hopper_dense_mla(sizes: Sizes) -> Callable[[], None]:
    def run() -> None:
        from gluon_kernels.hopper.dense_mla import dense_mla_hopper

        batch, q, cache, _ = mla_inputs(sizes)
        dense_mla_hopper(q, cache.latent, cache.latent_scale, batch.block_tables,
                         batch.token_request, batch.positions, batch.block_size, 192 ** -0.5,
                         max_position=batch.max_position,
                         rows_per_request=batch.rows_per_request)
    return hopper_only(run)


def _sized(prefix: str, make: Callable[[Sizes], Callable[[], None]]) -> dict:
    return {f"{prefix}[{name}]": make(sizes) for name, sizes in SIZES.items()}


EXAMPLES: dict[str, Callable[[], None]] = {
    **_sized("amd indexer_score fp8", lambda s: amd_indexer("fp8", s)),
    **_sized("amd indexer_score mxfp4", lambda s: amd_indexer("mxfp4", s)),
    **_sized("amd topk_slots", amd_topk_slots),
    **_sized("hopper indexer_score", hopper_indexer),
    **_sized("hopper sparse_mla", hopper_sparse_mla),
    **_sized("hopper dense_mla", hopper_dense_mla),
}
