"""One step's work in plain values, and the ForwardBatch a rank builds from it.

The first rank's scheduler decides a step; `StepRequest` is each scheduled sequence's share
of it as plain ints (its new tokens, where they start, its block table, its KDA slot and the
snapshots to take), which is all a rank needs to run the step: under tensor parallelism the
first rank broadcasts the list, and every rank (the first included) builds its own
`ForwardBatch` from it with `build_forward_batch`, so all of them run the same forward.

Cache slots. The scheduler's blocks hold ``page_size x dcp_size`` tokens. Without DCP, token
``p`` of a request goes to slot ``table[p // page_size] * page_size + p % page_size``. Under DCP
of size W (round-robin by token, ``model/dcp_attention.py``) only DCP rank ``p % W`` stores
it, at local position ``p // W``: slot ``table[p // (page_size W)] * page_size +
(p // W) % page_size``; the other ranks' slot is -1 (not written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from atomk31.engine.scheduler import ScheduledSequence
from atomk31.model import ForwardBatch

# Start of every column in the packed upload: kernels may load them with 16-byte accesses.
UPLOAD_ALIGN_BYTES = 16


@dataclass
class StepRequest:
    """One sequence's share of a step. `of` takes the sequence's block table itself, not a
    copy (a step's requests are used, or pickled for the other ranks, before the scheduler
    changes any table: copying every table of a long-context batch each step costs ~1 ms)."""

    token_ids: list[int]                 # the tokens computed this step
    start: int                           # position of the first of them
    block_table: list[int]
    state_slot: int
    is_last_chunk: bool                  # its logits are wanted (it samples)
    # (m, slot): the KDA state after the first m tokens of this step goes to state slot `slot`
    snapshots: list[tuple[int, int]] = field(default_factory=list)
    # offsets (within this step's tokens) whose logits are wanted for prompt logprobs: after
    # every request's sampling row, in request order
    prompt_logit_rows: list[int] = field(default_factory=list)
    # a speculative verify pass (engine/speculative.py): draft tokens after `token_ids`, every
    # row's logits wanted
    draft_tokens: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, item: ScheduledSequence, draft_tokens: list[int] = ()) -> "StepRequest":
        seq, start = item.seq, item.seq.num_computed_tokens
        return cls(seq.all_token_ids[start:start + item.num_new_tokens], start,
                   seq.block_table, seq.state_slot, item.is_last_chunk,
                   [(m, slot) for m, slot, _ in item.snapshots],
                   [p - 1 - start for p in prompt_logprob_positions(item)], list(draft_tokens))


def prompt_logprob_positions(item: ScheduledSequence) -> list[int]:
    """The prompt positions p >= 1 whose logprob this step of ``item`` can give (token p - 1
    computed now, p < the last prompt token's sampling row), [] when none are asked for."""
    seq, start = item.seq, item.seq.num_computed_tokens
    if not seq.needs_prompt_logprobs:
        return []
    last = min(start + item.num_new_tokens, seq.num_prompt_tokens - 1)
    return list(range(start + 1, last + 1))


def slot_of(position: int, block_table: list[int], page_size: int, dcp_size: int = 1,
            dcp_rank: int = 0) -> int:
    """The cache slot of ``position`` on this rank, -1 when another DCP rank stores it."""
    if position % dcp_size != dcp_rank:
        return -1
    block = block_table[position // (page_size * dcp_size)]
    return block * page_size + (position // dcp_size) % page_size


def build_forward_batch(requests: list[StepRequest], page_size: int, device: torch.device,
                        dcp_size: int = 1, dcp_rank: int = 0,
                        row_states: list[tuple[int, int, int]] = ()) -> ForwardBatch:
    """The batch of ``requests``: logits rows are each request's sampling row (every row of a
    verify pass), then the prompt-logprob rows; ``row_states`` (r, m, slot) are snapshots too:
    the KDA state of request r after its first m rows kept in ``slot`` (§5.7)."""
    ids: list[int] = []
    positions: list[int] = []
    token_request: list[int] = []
    slot_mapping: list[int] = []
    cu_seqlens = [0]
    logits_indices: list[int] = []
    snapshots: list[tuple[int, int, int]] = []
    for r, request in enumerate(requests):
        tokens, start = request.token_ids + request.draft_tokens, request.start
        n = len(tokens)
        ids.extend(tokens)
        positions.extend(range(start, start + n))
        token_request.extend([r] * n)
        slot_mapping.extend(slot_of(p, request.block_table, page_size, dcp_size, dcp_rank)
                            for p in range(start, start + n))
        cu_seqlens.append(cu_seqlens[-1] + n)
        if request.draft_tokens:
            logits_indices.extend(range(cu_seqlens[-1] - n, cu_seqlens[-1]))
        elif request.is_last_chunk:
            logits_indices.append(cu_seqlens[-1] - 1)
        snapshots.extend((r, m, slot) for m, slot in request.snapshots)
    snapshots.extend(row_states)
    counts = [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    # every request verifies the same number of rows and keeps the state after each: the KDA
    # layers may then run kda_verify (model/kda_layer.py)
    is_verify = (all(request.draft_tokens for request in requests) and len(set(counts)) == 1
                 and not any(request.snapshots for request in requests))
    logits_indices.extend(cu_seqlens[r] + row for r, request in enumerate(requests)
                          for row in request.prompt_logit_rows)
    max_blocks = max(len(request.block_table) for request in requests)
    tables = [b for request in requests
              for b in request.block_table + [-1] * (max_blocks - len(request.block_table))]
    t = upload(device, {
        "input_ids": (ids, torch.int64), "positions": (positions, torch.int64),
        "slot_mapping": (slot_mapping, torch.int64),
        "state_slots": ([request.state_slot for request in requests], torch.int64),
        "has_initial_state": ([int(request.start > 0) for request in requests], torch.int64),
        "logits_indices": (logits_indices, torch.int64),
        "snapshots": ([v for row in snapshots for v in row], torch.int64),
        "token_request": (token_request, torch.int32), "cu_seqlens": (cu_seqlens, torch.int32),
        "block_tables": (tables, torch.int32)})
    return ForwardBatch(
        input_ids=t["input_ids"],
        positions=t["positions"],
        token_request=t["token_request"],
        cu_seqlens=t["cu_seqlens"],
        block_tables=t["block_tables"].view(len(requests), max_blocks),
        slot_mapping=t["slot_mapping"],
        state_slots=t["state_slots"],
        has_initial_state=t["has_initial_state"].bool(),
        logits_indices=t["logits_indices"],
        snapshots=t["snapshots"].view(-1, 3),
        block_size=page_size,
        max_position=max(positions),
        is_decode_only=all(n == 1 for n in counts),
        rows_per_request=math.gcd(*counts),
        verify_rows=counts[0] if is_verify else 0,
    )


def upload(device: torch.device, columns: dict[str, tuple[list[int], torch.dtype]]
           ) -> dict[str, torch.Tensor]:
    """The step's integer columns on ``device`` with one host-to-device copy per dtype: packed
    into one buffer (pinned on a GPU, so the copy is asynchronous) and split into views there.
    A copy per column from pageable memory would cost a launch and a host stall each."""
    out: dict[str, torch.Tensor] = {}
    for dtype in {dtype for _, dtype in columns.values()}:
        names = [name for name, (_, d) in columns.items() if d == dtype]
        align = UPLOAD_ALIGN_BYTES // dtype.itemsize
        flat: list[int] = []
        starts = []
        for name in names:           # every column starts on a 16-byte boundary
            starts.append(len(flat))
            flat.extend(columns[name][0])
            flat.extend([0] * (-len(flat) % align))
        host = torch.tensor(flat, dtype=dtype)
        if device.type == "cuda":
            host = host.pin_memory()
        packed = host.to(device, non_blocking=True)
        for name, start in zip(names, starts):
            out[name] = packed[start:start + len(columns[name][0])]
    return out
