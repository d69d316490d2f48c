"""atomk31/bench/synthetic_context.py: requests placed at a context without prefill, their cache
rows and KDA states filled with random values in the engine's formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atomk31.bench.synthetic_context import CacheTooSmallError, place_batch
from atomk31.engine.sequence import SequenceStatus


def placed_sequences(engine, request_ids):
    return [engine.requests[r].seqs[0] for r in request_ids]


def test_placed_requests_hold_random_cache_rows_and_states(engine):
    request_ids = place_batch(engine, 2, first_context=40, num_steps=2,
                              rng=np.random.default_rng(0))
    try:
        block_size = engine.scheduler.block_size
        for seq in placed_sequences(engine, request_ids):
            assert seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens == 39
            assert seq.num_tokens == 40 and len(seq.block_table) == 3
            positions = torch.arange(39)
            blocks = torch.tensor(seq.block_table)[positions // block_size]
            offsets = positions % block_size
            for view in engine.runner.kv_views:
                latent = view.latent[blocks, offsets].float()
                assert 0.8 < latent.std().item() < 1.2        # N(0, 1) rows, every position
                assert latent.abs().amax(dim=1).min() > 0
                scales = view.index_scales[blocks, offsets]
                assert bool((scales > 0).all())                # valid FP8 key scales
                assert torch.isfinite(view.index_values[blocks, offsets].float()).all()
            recurrent = engine.state_pool.recurrent[:, seq.state_slot]
            assert 0.08 < recurrent.std().item() < 0.12
            assert 0.8 < engine.state_pool.conv[:, seq.state_slot].float().std().item() < 1.2
    finally:
        for request_id in request_ids:
            engine.abort_request(request_id)


def test_the_first_step_computes_only_the_last_prompt_token(engine):
    request_ids = place_batch(engine, 2, first_context=40, num_steps=2,
                              rng=np.random.default_rng(1))
    seqs = placed_sequences(engine, request_ids)
    scheduled = engine.scheduler.schedule()
    assert [(item.seq, item.num_new_tokens) for item in scheduled] == [(s, 1) for s in seqs]
    engine.runner.run(scheduled)
    engine.scheduler.complete(scheduled)
    assert [s.num_computed_tokens for s in seqs] == [40, 40]
    for request_id in request_ids:
        engine.abort_request(request_id)


def test_placed_requests_decode_to_their_length_and_free_everything(engine):
    request_ids = place_batch(engine, 2, first_context=20, num_steps=2,
                              rng=np.random.default_rng(2))
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert sorted(finished) == sorted(request_ids)
    for out in finished.values():
        assert len(out.outputs[0].token_ids) == 2 and out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("num_requests, context", [(8, 4000), (9, 20)],
                         ids=["too-few-blocks", "over-max-num-seqs"])
def test_a_batch_the_cache_cannot_hold_is_refused_and_nothing_stays_placed(engine, num_requests,
                                                                           context):
    with pytest.raises(CacheTooSmallError, match=rf"{num_requests} requests at a context of "
                                                 rf"{context} tokens need .* Lower --batch-sizes"):
        place_batch(engine, num_requests, first_context=context - 1, num_steps=2,
                    rng=np.random.default_rng(3))


def test_a_first_context_below_one_is_refused(engine):
    with pytest.raises(ValueError, match="first_context must be >= 1, got 0"):
        place_batch(engine, 1, first_context=0, num_steps=1, rng=np.random.default_rng(4))
