"""ForwardBatch: everything one engine step hands the model, as tensors on the device.

A step runs N requests together; request r contributes the tokens
`input_ids[cu_seqlens[r]:cu_seqlens[r+1]]` (a decode is one token, a prefill chunk many), at
absolute positions `positions`. Nothing here knows about Sequence objects: the model runner
builds it, the model reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor          # int64 [T]
    positions: torch.Tensor          # int64 [T] absolute position of each token
    token_request: torch.Tensor      # int32 [T] request index r of each token
    cu_seqlens: torch.Tensor         # int32 [N+1] token ranges per request
    block_tables: torch.Tensor       # int32 [N, max_blocks], -1 padded
    slot_mapping: torch.Tensor       # int64 [T] cache slot each token's MLA rows are written to
    state_slots: torch.Tensor        # int64 [N] KDA state slot of each request
    has_initial_state: torch.Tensor  # bool [N] False for a request's first tokens (zero state)
    logits_indices: torch.Tensor     # int64 [M] tokens whose next-token logits are wanted
    # KDA prefix snapshots taken during this step: rows (r, m, snapshot slot): the state of
    # request r after its first m tokens of this step goes to KDA state slot `snapshot slot`.
    snapshots: torch.Tensor          # int64 [S, 3]
    block_size: int
    max_position: int                # max(positions), known on the host (no device sync)
    is_decode_only: bool             # every request has exactly one new token
    # gcd of the requests' new-token counts (host side): rows come in runs of a multiple of
    # this per request, so attention may give that many rows of one request to one program
    # (4 verification rows share their keys); 1 when nothing is known
    rows_per_request: int = 1
    # speculative verification (host side): every request has this many rows and `snapshots`
    # holds the state after each of them, request by request, row by row (§5.7); 0 otherwise
    verify_rows: int = 0

    @property
    def num_requests(self) -> int:
        return self.cu_seqlens.numel() - 1


@dataclass
class AttentionRows:
    """Query rows for one attention call: a whole batch, or a subset of its tokens (token-
    sharded prefill), with what the attention ops need about them."""

    request: torch.Tensor            # int32 [n] request of each row
    position: torch.Tensor           # int64 [n] its last key position (absolute, in this cache)
    block_tables: torch.Tensor       # int32 [N, max_blocks]
    block_size: int
    max_position: int                # >= max(position), on the host
    rows_per_request: int = 1        # dense_mla's hint (ForwardBatch.rows_per_request)

    @classmethod
    def of_batch(cls, batch: ForwardBatch) -> "AttentionRows":
        return cls(batch.token_request, batch.positions, batch.block_tables, batch.block_size,
                   batch.max_position, batch.rows_per_request)

    def subset(self, index: torch.Tensor) -> "AttentionRows":
        """The rows ``index`` (their runs per request unknown: hint 1)."""
        return AttentionRows(self.request[index], self.position[index], self.block_tables,
                             self.block_size, self.max_position)
