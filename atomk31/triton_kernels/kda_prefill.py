"""KDA chunked prefill in Triton over variable-length requests (MODEL_SPEC §4.4, chunked form).

The contract is ``kda_prefill`` of ``atomk31/ops/kda_prefill.py``; this file holds no kernel.
It plans the chunks on the host, then runs the stages in order:

1. stage 1 (one program per chunk and head, all in parallel): the chunk-local scores, the
   unit lower-triangular solve and the gated keys/queries. In one kernel,
   ``kda_prefill_intra``; or (``KdaPrefillTuning.intra_split``) in two,
   ``kda_prefill_scores_wide`` (scores and the solve as [64, 64] accumulators, the head
   dimension in slices) then ``kda_prefill_gated`` (gated rows, w and u as [64, 64] x
   [64, BLOCK] matmuls); or (``intra_split`` and ``fold_w_u``) with no gated kernel at all:
   the wide kernel also writes the gated rows
   qg, kd, kb = β k̂ ⊙ exp(Γ), and stage 2 forms V' = P (β v - kb S) itself, so w and u
   never go through memory (stage 1b's traffic, ~1.9 GB at 1 x 8K, traded for ~0.6 GB more
   writes in stage 1a and one [64, 64] x [64, BLOCK_V] product more per chunk in stage 2);
2. ``kda_prefill_state`` (one program per request, head and value block, chunk after
   chunk): the state, the snapshots, and either the output (fused) or, by default, the
   state before each chunk and V' for stage 3;
3. ``kda_prefill_output`` (one program per chunk, head and value block, in parallel): the
   output, so that the sequential stage 2 does only its two products per chunk.

Chunk table: each request is cut every 64 tokens and at every snapshot point ``m`` of its
``snapshot_at`` rows, so a snapshot is the state after a chunk, recorded as the chunk ends,
never reconstructed. Snapshots at ``m = 0`` are the initial state; repeated rows are copies.

Intermediates are kept in the input's dtype (BF16 inputs -> BF16 w/qg/kd/u, as
flash-linear-attention does), except the scores and every carried state, which stay fp32.
Products: IEEE fp32 for fp32 inputs; with BF16 intermediates, BF16 operands in stages 2 and
3 and in stage 1's w/u (the state, V', the inverse and the right-hand sides rounded for the
product, fp32 accumulation, as fla does) and TF32 in stage 1's scores. Memory: about ``T * H * (3K + 2V + BT + KV/BT) * itemsize`` for the intermediates
(~0.15 MB per token at H = 96, BF16).

Limits: chunk_size 64 only; each per-token decay g must be >= -5.8 (see kda_prefill_intra.py;
K3.1's gate floor is -5). Planning reads cu_seqlens and snapshot_at on the host (one sync),
or (``KdaPrefillTuning.plan_on_device``, no snapshots, at most 1024 requests) runs on the
GPU without a sync (kda_prefill_plan.py), not checking cu_seqlens' values.
"""

import torch
from triton.runtime import driver

from atomk31.triton_kernels.kda_prefill_gated import kda_prefill_gated
from atomk31.triton_kernels.kda_prefill_intra import (
    CHUNK_SIZE, kda_prefill_intra, kda_prefill_intra_kernel,
)
from atomk31.triton_kernels.kda_prefill_output import kda_prefill_output
from atomk31.triton_kernels.kda_prefill_plan import plan_chunks_on_device
from atomk31.triton_kernels.kda_prefill_scores_wide import kda_prefill_scores_wide
from atomk31.triton_kernels.kda_prefill_state import kda_prefill_state
from atomk31.triton_kernels.kda_prefill_tuning import KdaPrefillTuning
from atomk31.triton_kernels.runtime import runs_on_interpreter

# The device planner keeps all requests in one program's registers.
MAX_REQUESTS_PLANNED_ON_DEVICE = 1024


def kda_prefill_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
    chunk_size: int = 64,
    snapshot_at: torch.Tensor | None = None,
    tuning: KdaPrefillTuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Chunked KDA -> (o [T, H, V] in v.dtype, final_state fp32 [N, H, K, V],
    snapshots fp32 [M, H, K, V] | None).

    q, k: [T, H, K] raw; v: [T, H, V]; g: fp32 [T, H, K] log-decay; beta: fp32 [T, H];
    initial_state: fp32 [N, H, K, V] (not modified); cu_seqlens: int32 [N+1];
    snapshot_at: int64 [M, 2] rows (request, tokens). ``tuning``: the stages' kernels and
    tiles (kda_prefill_tuning.py; None: ``default_tuning``), the intermediates' dtype among them
    (None: v's dtype when it is BF16/FP16, else fp32).
    """
    if chunk_size != CHUNK_SIZE:
        raise ValueError(f"kda_prefill (triton) supports chunk_size={CHUNK_SIZE} only, got "
                         f"{chunk_size}; use the torch backend for other chunk sizes")
    _check_inputs(q, k, v, g, beta, initial_state, cu_seqlens, snapshot_at)
    tuning = tuning or default_tuning(v.dtype)
    device = q.device
    if tuning.plan_on_device and snapshot_at is None \
            and cu_seqlens.shape[0] <= MAX_REQUESTS_PLANNED_ON_DEVICE + 1:
        # No host sync (and no check of cu_seqlens' values): kda_prefill_plan.py.
        table = plan_chunks_on_device(cu_seqlens.to(device), q.shape[0], CHUNK_SIZE)
        plan, snapshot_rows = {"copies": []}, []
    else:
        bounds = cu_seqlens.tolist()
        snapshot_rows = [] if snapshot_at is None else snapshot_at.tolist()
        _check_bounds(bounds, snapshot_rows, q.shape[0])
        plan = plan_chunks(bounds, snapshot_rows)
        table = chunk_table(plan, device)
    q, k, v = (_token_major(x) for x in (q, k, v))
    g, beta = g.float().contiguous(), beta.float().contiguous()
    intermediate_dtype = tuning.intermediate_dtype or \
        (v.dtype if v.dtype in (torch.bfloat16, torch.float16) else torch.float32)
    intra = run_intra(q, k, v, g, beta, table["chunk_start"], table["chunk_len"], scale,
                      intermediate_dtype, tuning)
    num_snapshots = len(snapshot_rows)
    snapshots = torch.empty((max(num_snapshots, 1),) + tuple(initial_state.shape[1:]),
                            dtype=torch.float32, device=device)
    o = torch.empty(v.shape, dtype=v.dtype, device=device)
    final_state, stage2 = kda_prefill_state(intra, initial_state.contiguous(), o, snapshots,
                                            table["chunk_start"], table["chunk_len"],
                                            table["chunk_snapshot"], table["request_chunks"],
                                            tuning)
    if stage2 is not None:
        kda_prefill_output(intra, stage2, o, table["chunk_start"], table["chunk_len"],
                           tuning.bf16_products, tuning.output_block_v)
    for target, source in plan["copies"]:
        snapshots[target] = initial_state[source[1]] if source[0] == "initial" \
            else snapshots[source[1]]
    return o, final_state, snapshots[:num_snapshots] if snapshot_at is not None else None


def run_intra(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    chunk_start: torch.Tensor, chunk_len: torch.Tensor, scale: float,
    intermediate_dtype: torch.dtype, tuning: KdaPrefillTuning,
) -> dict[str, torch.Tensor]:
    """Stage 1, in one kernel (kda_prefill_intra.py) or split (kda_prefill_scores_wide.py,
    then kda_prefill_gated.py unless the gated rows are folded into stage 2), as ``tuning``
    says; every path returns what stage 2 reads."""
    if tuning.intra_split and tuning.fold_w_u:
        return _wide_with_gated_rows(q, k, v, g, beta, chunk_start, chunk_len, scale,
                                     intermediate_dtype, tuning)
    if tuning.intra_split:
        scores = kda_prefill_scores_wide(q, k, g, beta, chunk_start, chunk_len, scale, tuning,
                                         intermediate_dtype if tuning.compact_scores
                                         else torch.float32)
        return kda_prefill_gated(q, k, v, g, beta, chunk_start, chunk_len, scores,
                                 intermediate_dtype, tuning.gated_block, tuning.gated_num_warps,
                                 tuning.bf16_products)
    return kda_prefill_intra(q, k, v, g, beta, chunk_start, chunk_len, scale,
                             intermediate_dtype, tuning.intra_num_warps,
                             tuning.intra_cache_right)


def _wide_with_gated_rows(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    chunk_start: torch.Tensor, chunk_len: torch.Tensor, scale: float,
    intermediate_dtype: torch.dtype, tuning: KdaPrefillTuning,
) -> dict[str, torch.Tensor]:
    """Stage 1 as one kernel without products of its own (``fold_w_u``): the wide stage 1a
    also writes qg, kd, kb = β k̂ ⊙ exp(Γ) and decay; stage 2 then forms V' = P (β v - kb S),
    so w and u never go through memory. Returns what stage 2 reads: those rows, aqk, the
    inverse P, and the inputs v, beta."""
    num_chunks, num_heads, head_dim = max(chunk_start.shape[0], 1), q.shape[1], q.shape[2]
    rows = (num_chunks, num_heads, CHUNK_SIZE, head_dim)
    gated_rows = {name: torch.empty(rows, dtype=intermediate_dtype, device=q.device)
                  for name in ("qg", "kd", "kb")}
    gated_rows["decay"] = torch.empty(rows[:2] + rows[3:], dtype=torch.float32, device=q.device)
    scores = kda_prefill_scores_wide(q, k, g, beta, chunk_start, chunk_len, scale, tuning,
                                     intermediate_dtype if tuning.compact_scores
                                     else torch.float32, gated_rows)
    return {**gated_rows, "aqk": scores["aqk"], "inverse": scores["inverse"], "v": v,
            "beta": beta}


def default_tuning(dtype: torch.dtype) -> KdaPrefillTuning:
    """The launchers' choices, per target and input dtype (the measurements behind them:
    benchmarks/NOTES.md, "KDA prefill").

    CUDA, BF16/FP16 inputs: stage 1a as [64, 64] accumulators (kda_prefill_scores_wide.py,
    BF16 score products, 16-bit aqk and inverse, TF32 solve as fla's) writing the gated rows
    too, w and u folded into stage 2 (``fold_w_u``: no stage 1b, whose memory traffic was
    longer than the work the fold adds), and the chunk table planned on the GPU when there are
    no snapshots (the host planner's sync leaves the GPU idle). FP32 inputs keep the exact
    single kernel. AMD: a lane has 512 VGPRs, 256 for two waves per SIMD; 8-warp stage 1,
    64-wide stage 3 and 32-wide, (gfx942) unpipelined stage 2 stay within them (4 warps /
    128-wide / 64-wide stage 2 / 2 stages need 264-290)."""
    if runs_on_interpreter(kda_prefill_intra_kernel):
        return KdaPrefillTuning()
    target = driver.active.get_current_target()
    if target.backend != "hip":
        if dtype in (torch.bfloat16, torch.float16):
            return KdaPrefillTuning(intra_split=True, compact_scores=True,
                                    scores_tf32_solve=True, plan_on_device=True,
                                    scores_bf16=True, fold_w_u=True)
        return KdaPrefillTuning()
    return KdaPrefillTuning(intra_num_warps=8, output_block_v=64, block_v=32,
                            num_stages=1 if target.arch == "gfx942" else None)


def chunk_table(plan: dict[str, list], device: torch.device) -> dict[str, torch.Tensor]:
    """The plan's int32 columns on the device, in one host-to-device copy (each copy is a
    synchronous round trip of some microseconds): views of one buffer."""
    names = [name for name in plan if name != "copies"]
    flat = torch.tensor([value for name in names for value in plan[name]], dtype=torch.int32,
                        device=device)
    return dict(zip(names, flat.split([len(plan[name]) for name in names])))


def plan_chunks(bounds: list[int], snapshot_rows: list[list[int]]) -> dict[str, list]:
    """Cut each request every CHUNK_SIZE tokens and at its snapshot points.

    Returns chunk_start / chunk_len / chunk_snapshot (snapshot index written after the chunk,
    -1 if none) per chunk, request_chunks [N+1] (each request's range of chunks), and copies:
    (snapshot index, ("initial", request) | ("snapshot", index)) to fill after the kernels.
    """
    cuts_by_request: dict[int, dict[int, list[int]]] = {}
    for index, (request, tokens) in enumerate(snapshot_rows):
        cuts_by_request.setdefault(request, {}).setdefault(tokens, []).append(index)
    plan: dict[str, list] = {"chunk_start": [], "chunk_len": [], "chunk_snapshot": [],
                             "request_chunks": [0], "copies": []}
    for request in range(len(bounds) - 1):
        start, length = bounds[request], bounds[request + 1] - bounds[request]
        snapshots_at = cuts_by_request.get(request, {})
        for index in snapshots_at.get(0, []):
            plan["copies"].append((index, ("initial", request)))
        cuts = sorted(set(range(0, length, CHUNK_SIZE)) | set(snapshots_at) | {length})
        for a, b in zip(cuts, cuts[1:]):
            plan["chunk_start"].append(start + a)
            plan["chunk_len"].append(b - a)
            indices = snapshots_at.get(b, [])
            plan["chunk_snapshot"].append(indices[0] if indices else -1)
            plan["copies"].extend((index, ("snapshot", indices[0])) for index in indices[1:])
        plan["request_chunks"].append(len(plan["chunk_start"]))
    return plan


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] with dense heads and channels; the token stride may be anything (views of a
    fused q|k|v projection pass without a copy)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def _check_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: torch.Tensor, cu_seqlens: torch.Tensor, snapshot_at: torch.Tensor | None,
) -> None:
    if initial_state.dim() != 4 or initial_state.dtype != torch.float32:
        raise ValueError("kda_prefill: initial_state must be fp32 [N, H, K, V], got "
                         f"{initial_state.dtype} {tuple(initial_state.shape)}")
    num_requests, num_heads, head_dim, value_dim = initial_state.shape
    num_tokens = q.shape[0] if q.dim() == 3 else -1
    expected = {"q": (num_tokens, num_heads, head_dim), "k": (num_tokens, num_heads, head_dim),
                "v": (num_tokens, num_heads, value_dim), "g": (num_tokens, num_heads, head_dim),
                "beta": (num_tokens, num_heads)}
    arrived = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, shape in expected.items():
        if tuple(arrived[name].shape) != shape:
            raise ValueError(f"kda_prefill: {name} must have shape {list(shape)} (T from q, H, "
                             f"K, V from initial_state [N, H, K, V]), got "
                             f"{list(arrived[name].shape)}")
    if cu_seqlens.shape != (num_requests + 1,) or cu_seqlens.dtype not in (torch.int32,
                                                                            torch.int64):
        raise ValueError(f"kda_prefill: cu_seqlens must be int32 [N+1] = [{num_requests + 1}], "
                         f"got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if snapshot_at is not None and (snapshot_at.dim() != 2 or snapshot_at.shape[1] != 2):
        raise ValueError("kda_prefill: snapshot_at must be [M, 2] rows of (request, tokens) or "
                         f"None, got shape {tuple(snapshot_at.shape)}")


def _check_bounds(bounds: list[int], snapshot_rows: list[list[int]], num_tokens: int) -> None:
    if bounds[0] != 0 or bounds[-1] != num_tokens or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"kda_prefill: cu_seqlens must rise from 0 to T={num_tokens} without "
                         f"decreasing, got {bounds}")
    for request, tokens in snapshot_rows:
        if not 0 <= request < len(bounds) - 1 or \
                not 0 <= tokens <= bounds[request + 1] - bounds[request]:
            raise ValueError(f"kda_prefill: snapshot_at row ({request}, {tokens}) is out of "
                             f"range: need 0 <= request < {len(bounds) - 1} and 0 <= tokens <= "
                             "that request's length in this batch")
