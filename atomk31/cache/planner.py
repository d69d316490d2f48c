"""The memory planner: splits one cache byte budget between KDA state slots and MLA blocks.

Order of claims on the budget (DESIGN.md §4, MODEL_SPEC §7):
  1. `max_num_seqs` KDA state slots, one per running request (449,372,160 B each for the full
     model, §7.3): without them nothing runs. With speculative decoding of Tb drafts each
     request holds `1 + Tb` slots: a verify pass keeps the state after each of its rows (§5.7).
  2. prefix-cache snapshot slots: `snapshot_fraction` of the budget, but never so much that
     fewer blocks remain than one `max_model_len` request needs.
  3. everything left: blocks of `row_bytes` (16,992 B/token for K3.1 fp8 + fp8 keys, §7.2;
     a DSpark draft's pages add 576 B/token per draft layer, paid through `row_bytes`).
The budget itself (from --gpu-memory-utilization or --kv-cache-memory) is the caller's.
"""

from dataclasses import dataclass

from atomk31.cache.layout import PackedLayout
from atomk31.cache.state_pool import KDAStateSpec

_GIB = 1024**3


@dataclass(frozen=True)
class CachePlan:
    """Pool sizes; `num_state_slots` = the requests' slots (max_num_seqs x
    state_slots_per_request) + `num_snapshot_slots`."""

    num_blocks: int
    num_state_slots: int
    num_snapshot_slots: int
    bytes_blocks: int
    bytes_states: int


def plan_cache(
    budget_bytes: int,
    layout: PackedLayout,
    state_spec: KDAStateSpec,
    max_num_seqs: int,
    max_model_len: int,
    snapshot_fraction: float = 0.1,
    state_slots_per_request: int = 1,
) -> CachePlan:
    """Size the block pool and the KDA state pool to fit `budget_bytes` (see module doc).

    Raises ValueError when the budget cannot hold `max_num_seqs` states plus the blocks of
    one `max_model_len`-token request.
    """
    if budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if max_num_seqs < 1 or max_model_len < 1:
        raise ValueError(
            f"max_num_seqs and max_model_len must be >= 1, got {max_num_seqs} and "
            f"{max_model_len}"
        )
    if not 0.0 <= snapshot_fraction < 1.0:
        raise ValueError(f"snapshot_fraction must be in [0, 1), got {snapshot_fraction}")
    if state_slots_per_request < 1:
        raise ValueError(f"state_slots_per_request must be >= 1, got {state_slots_per_request}")
    slot_bytes = state_spec.bytes_per_slot()
    num_request_slots = max_num_seqs * state_slots_per_request
    request_state_bytes = num_request_slots * slot_bytes
    blocks_per_request = -(-max_model_len // layout.block_size)
    min_block_bytes = blocks_per_request * layout.row_bytes
    spare_bytes = budget_bytes - request_state_bytes - min_block_bytes
    if spare_bytes < 0:
        raise ValueError(
            f"the cache budget of {budget_bytes / _GIB:.2f} GiB holds less than "
            f"{num_request_slots} KDA states ({request_state_bytes / _GIB:.2f} GiB) plus the "
            f"{blocks_per_request} blocks of one {max_model_len}-token request "
            f"({min_block_bytes / _GIB:.2f} GiB); lower --max-num-seqs / --max-model-len "
            "or raise --gpu-memory-utilization"
        )
    num_snapshot_slots = 0
    if slot_bytes > 0:  # a model without KDA layers needs no snapshots
        snapshot_bytes = min(int(snapshot_fraction * budget_bytes), spare_bytes)
        num_snapshot_slots = snapshot_bytes // slot_bytes
    num_state_slots = num_request_slots + num_snapshot_slots
    bytes_states = num_state_slots * slot_bytes
    num_blocks = (budget_bytes - bytes_states) // layout.row_bytes
    return CachePlan(
        num_blocks=num_blocks,
        num_state_slots=num_state_slots,
        num_snapshot_slots=num_snapshot_slots,
        bytes_blocks=num_blocks * layout.row_bytes,
        bytes_states=bytes_states,
    )
