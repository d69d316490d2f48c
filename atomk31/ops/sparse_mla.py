"""sparse_mla: absorbed MLA attention of query rows over selected latent-cache rows.

Contract (§4.5 "Weight absorption", §4.6 "Effect on MLA")
--------
Inputs:
  q              [Nq, H, 576] float: absorbed queries [q_nope·W_uk (512) | q_lane (64)].
  latent_cache   [num_blocks, block_size, 576] float32 | bfloat16 | float8_e4m3fn(uz), any
                 strides; rows [c 512 | k_r 64] (§7.1).
  latent_scale   float: static scale of an fp8 latent (read = stored * scale); else ignored.
  slots          [Nq, k] int32: the rows each query may attend to; -1 = masked.
  softmax_scale  float: 1/sqrt(192) for K3.1 (§4.5; not 1/sqrt(576)).
Outputs:
  out [Nq, H, 512] fp32: softmax_s((q · row_s) * softmax_scale) @ row_s[:512] over valid slots.
  lse [Nq, H] fp32: natural log-sum-exp of the scaled scores over valid slots, so partial
      results over disjoint slot sets merge exactly (DCP, split-k).
  A row with no valid slot gives out = 0, lse = -inf. Slot order does not matter.
Accumulation: fp32 (scores, exp, sums). Tests: against a naive per-row softmax,
rtol 1e-5, atol 1e-5.

Also here: `softmax_attend`, the masked softmax-times-values step that `dense_mla` shares.
"""

import torch

from atomk31.ops.kv_write import LATENT_DIM, check_latent_cache, read_latent
from atomk31.ops.registry import define_op, register
from atomk31.ops.requirements import (
    READS_DEVICE, all_of, needs_compute, needs_gpu, needs_hopper, needs_latent, needs_rocm,
)

LATENT_VALUE_DIM = 512  # value = the compressed latent c only (§4.5)
# Bound on the gathered [rows, k, 576] latent rows plus [rows, H, k] scores held at once
# (fp32 elements, 256 MiB), so the torch path also runs a long prefill on a GPU.
MAX_CHUNK_ELEMENTS = 1 << 26


def check_mla_query(q: torch.Tensor, num_rows: int) -> None:
    """Raise ValueError unless q is [num_rows, H, 576]."""
    if q.dim() != 3 or q.shape[0] != num_rows or q.shape[2] != LATENT_DIM:
        raise ValueError(
            f"q must be [Nq={num_rows}, H, {LATENT_DIM}] absorbed queries, got {list(q.shape)}"
        )


def softmax_attend(
    scores: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last dim of scores, then weight the values.

    scores [n, H, S] fp32, masked keys at -inf; values [n, S, 512] or [S, 512] fp32.
    Returns out [n, H, 512] and lse [n, H]; a row with every key masked gets 0 and -inf.
    """
    row_max = scores.amax(dim=-1, keepdim=True)
    # A fully masked row has max -inf; shifting by 0 keeps exp() at 0 instead of NaN.
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1)  # [n, H]
    out = (weights @ values) / total.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    lse = torch.log(total) + row_max.squeeze(-1)
    return out, lse


def sparse_mla_torch(
    q: torch.Tensor,
    latent_cache: torch.Tensor,
    latent_scale: float,
    slots: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each row over its selected slots: (out [Nq, H, 512], lse [Nq, H]) fp32."""
    check_latent_cache(latent_cache, latent_scale)
    if slots.dim() != 2:
        raise ValueError(f"slots must be [Nq, k], got {list(slots.shape)}")
    num_rows, num_selected = slots.shape
    check_mla_query(q, num_rows)
    num_heads = q.shape[1]
    out = torch.zeros(num_rows, num_heads, LATENT_VALUE_DIM, device=q.device)
    lse = torch.full((num_rows, num_heads), -torch.inf, device=q.device)
    chunk = max(1, MAX_CHUNK_ELEMENTS // max(1, num_selected * (LATENT_DIM + num_heads)))
    for start in range(0, num_rows, chunk):
        end = min(start + chunk, num_rows)
        chunk_slots = slots[start:end]
        rows = read_latent(latent_cache, latent_scale, chunk_slots)  # [n, k, 576]
        scores = (q[start:end].float() @ rows.transpose(1, 2)) * softmax_scale  # [n, H, k]
        scores = scores.masked_fill((chunk_slots < 0)[:, None, :], -torch.inf)
        out[start:end], lse[start:end] = softmax_attend(scores, rows[..., :LATENT_VALUE_DIM])
    return out, lse


sparse_mla = sparse_mla_torch


def check_sparse_mla(q: torch.Tensor, latent_cache: torch.Tensor, latent_scale: float,
                     slots: torch.Tensor, softmax_scale: float) -> None:
    """The host-side argument check of `sparse_mla` (shapes and dtypes; no device reads)."""
    check_latent_cache(latent_cache, latent_scale)
    if slots.dim() != 2:
        raise ValueError(f"slots must be [Nq, k], got {list(slots.shape)}")
    check_mla_query(q, slots.shape[0])


# Query rows from which a call counts as "many rows" (prefill chunks): one workgroup per row
# then fills a GPU (MI355X: 256 CUs) without splitting each row's keys.
MANY_ROWS = 256


def sparse_mla_rows(q: torch.Tensor, *args, **kwargs) -> str:
    return "many_rows" if q.shape[0] >= MANY_ROWS else "few_rows"


define_op("sparse_mla", check=check_sparse_mla, classify=sparse_mla_rows,
          shapes={"few_rows": f"fewer than {MANY_ROWS} query rows (decode, verification)",
                  "many_rows": f"{MANY_ROWS} query rows or more (prefill)"})
register("sparse_mla", "torch", sparse_mla_torch, not_in_graph=READS_DEVICE)
register("sparse_mla", "triton", "atomk31.triton_kernels.sparse_mla:sparse_mla_triton",
         why_not=needs_gpu)
register("sparse_mla", "hopper", "gluon_kernels.hopper.sparse_mla:sparse_mla_hopper",
         why_not=all_of(needs_hopper, needs_latent(torch.float8_e4m3fn),
                        needs_compute(torch.bfloat16, torch.float16)))
register("sparse_mla", "amd", "flydsl_kernels.sparse_mla:sparse_mla_flydsl",
         why_not=all_of(needs_rocm(("gfx950",), "flydsl"), needs_latent(torch.float8_e4m3fn)),
         shapes=("many_rows",))
