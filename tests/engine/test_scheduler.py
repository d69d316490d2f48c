"""atomk31/engine/scheduler.py: `place_computed`, the benchmark hook that admits a sequence as if
its first tokens had been prefilled (issue 17)."""

from __future__ import annotations

import pytest

from atomk31.cache import BlockPool, KDAStatePool, KDAStateSpec, SnapshotIndex
from atomk31.engine.sampling_params import SamplingParams
from atomk31.engine.scheduler import Scheduler
from atomk31.engine.sequence import Sequence, SequenceStatus

BLOCK_SIZE = 4


def make_scheduler(num_blocks: int = 8, num_slots: int = 2, max_num_seqs: int = 4) -> Scheduler:
    spec = KDAStateSpec(num_kda_layers=1, num_heads=1, head_dim=2, conv_width=2, conv_channels=2)
    state_pool = KDAStatePool(spec, num_slots, "cpu")
    return Scheduler(BlockPool(num_blocks, BLOCK_SIZE), state_pool, SnapshotIndex(state_pool, 0),
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=64)


def waiting_sequence(scheduler: Scheduler, num_tokens: int = 10) -> Sequence:
    seq = Sequence("r", list(range(num_tokens)), SamplingParams(max_tokens=4))
    scheduler.add(seq)
    return seq


def test_a_placed_sequence_runs_with_its_blocks_and_slot_and_decodes_one_token():
    scheduler = make_scheduler()
    seq = waiting_sequence(scheduler)
    assert scheduler.place_computed(seq, 9)
    assert seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens == 9
    assert len(seq.block_table) == 3 and seq.state_slot is not None
    assert list(scheduler.running) == [seq] and not scheduler.waiting
    [item] = scheduler.schedule()
    assert item.seq is seq and item.num_new_tokens == 1 and item.is_last_chunk
    scheduler.complete([item])
    assert seq.num_computed_tokens == 10


@pytest.mark.parametrize("num_blocks, num_slots, max_num_seqs", [(2, 2, 4), (8, 0, 4), (8, 2, 0)],
                         ids=["blocks", "slots", "max-num-seqs"])
def test_no_room_leaves_the_sequence_waiting_with_nothing_taken(num_blocks, num_slots,
                                                                max_num_seqs):
    scheduler = make_scheduler(num_blocks, num_slots, max_num_seqs)
    seq = waiting_sequence(scheduler)
    assert not scheduler.place_computed(seq, 9)
    assert list(scheduler.waiting) == [seq] and seq.block_table == []
    assert scheduler.block_pool.num_free_blocks == num_blocks
    assert scheduler.state_pool.num_free_slots == num_slots


def test_place_computed_refuses_a_sequence_that_is_not_waiting():
    scheduler = make_scheduler()
    seq = Sequence("r", [1, 2, 3], SamplingParams())
    with pytest.raises(ValueError, match="is not waiting; place a sequence right after adding"):
        scheduler.place_computed(seq, 2)


@pytest.mark.parametrize("num_computed", [0, 10])
def test_place_computed_leaves_at_least_one_token_to_compute(num_computed):
    scheduler = make_scheduler()
    seq = waiting_sequence(scheduler)
    with pytest.raises(ValueError, match=rf"num_computed_tokens must be in 1..9 \(at least one "
                                         rf"token left to compute\), got {num_computed}"):
        scheduler.place_computed(seq, num_computed)
