"""Speculative decoding with a DSpark draft (atomk31/engine/speculative.py, issue 21): greedy
tokens equal those of plain decoding token for token across batches, chunked prefill,
prefix-cache hits, preemption and aborts; the KDA state after a rejection equals the state of
a plain run; every pool is free at the end.

The random tiny-dspark draft rarely proposes what the random tiny target picks, so most tests
also run `ScriptedDrafts`: it keeps the draft's pass but replaces its picks with the plain
run's next tokens, one of them changed at a position that cycles through 0..k, so that every
acceptance length (and the bonus token) occurs.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
NUM_DRAFTS = 3
LENGTHS = (3, 40, 90)         # 90 > index_topk 64: verify rows take the sparse path


def prompts_of(lengths, seed=0, vocab=768):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def engine_options(**overrides):
    options = dict(block_size=16, kernel_backend="torch", max_num_seqs=8)
    options.update(overrides)
    return options


def spec_llm(checkpoint, draft, num_drafts=NUM_DRAFTS, method="probabilistic", **overrides):
    return LLM(checkpoint, speculative_config={"model": str(draft),
                                               "num_speculative_tokens": num_drafts,
                                               "draft_sample_method": method},
               **engine_options(**overrides))


class ScriptedDrafts:
    """Drafts = the plain run's continuation of each request (`expected`: request id -> output
    tokens), with the draft at position `(k - c) % (k + 1)` changed in the request's c-th
    verify step (none when that is k): k, k - 1, ..., 0 drafts accepted in turn."""

    def __init__(self, llm: LLM, expected: dict[str, list[int]]):
        self.expected, self.calls = expected, {}
        proposer = llm.engine.speculative.proposer
        original = proposer.propose

        def propose(items, generators, ops, base_logits=None):
            proposal = original(items, generators, ops, base_logits)
            for r, item in enumerate(items):
                seq, k = item.seq, item.num_draft_tokens
                want = self.expected[seq.request_id][seq.num_output_tokens:]
                drafts = (want + [0] * k)[:k]
                count = self.calls.get(seq.request_id, 0)
                wrong = (k - count) % (k + 1)
                if wrong < k:
                    drafts[wrong] = (drafts[wrong] + 1) % 768
                proposal.tokens[r, :k] = torch.tensor(drafts)
                self.calls[seq.request_id] = count + 1
            return proposal

        proposer.propose = propose


@pytest.fixture(scope="module")
def plain_llm(tiny_checkpoint):
    """The engine without speculation: the tokens every test compares with."""
    return LLM(tiny_checkpoint, **engine_options())


@pytest.fixture(scope="module")
def plain_tokens(plain_llm):
    """Greedy tokens without speculation for prompts_of(LENGTHS)."""
    return tokens(plain_llm.generate(prompts_of(LENGTHS), GREEDY))


def test_random_draft_gives_the_plain_greedy_tokens(tiny_checkpoint, tiny_draft, plain_tokens,
                                                     pools_free):
    """Chunked prefill (32-token budget: the prompts take several steps, the 4 verify rows of a
    decoding request count against it) beside verify rows."""
    llm = spec_llm(tiny_checkpoint, tiny_draft, max_num_batched_tokens=32)
    rows = []
    original = llm.engine.scheduler.schedule

    def schedule():
        scheduled = original()
        rows.append(sum(i.num_new_tokens + i.num_draft_tokens for i in scheduled))
        return scheduled

    llm.engine.scheduler.schedule = schedule
    assert tokens(llm.generate(prompts_of(LENGTHS), GREEDY)) == plain_tokens
    stats = llm.engine.speculation_stats()
    assert stats.num_verify_steps > 0 and stats.num_draft_tokens > stats.num_verify_steps
    assert max(rows) <= 32
    pools_free(llm)


def test_accepted_drafts_give_the_plain_greedy_tokens(tiny_checkpoint, tiny_draft, plain_llm,
                                                       pools_free):
    """Every acceptance length, with chunked prefill beside the verify rows."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = prompts_of((3, 70))
    plain_tokens = tokens(plain_llm.generate(prompts, params))
    llm = spec_llm(tiny_checkpoint, tiny_draft, max_num_batched_tokens=48)
    ids = [llm.engine.add_request(p, params) for p in prompts]
    ScriptedDrafts(llm, dict(zip(ids, plain_tokens)))
    outputs = {}
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            outputs[out.request_id] = out
    assert [outputs[i].outputs[0].token_ids for i in ids] == plain_tokens
    stats = llm.engine.speculation_stats()
    assert all(count > 0 for count in stats.num_accepted_by_count), stats
    assert stats.mean_acceptance_length > 1.5
    pools_free(llm)


def test_a_prefix_cache_hit_at_a_snapshot_a_verify_step_took(tiny_checkpoint, tiny_draft,
                                                              plain_llm, pools_free):
    """Snapshots at every block (interval 16): the second turn (52 tokens) hits 3 blocks, the
    last of them (positions 32..47) completed by verify steps, whose KDA snapshot at 48 a
    verify step took, and goes on as the plain run."""
    prompt = prompts_of((40,), seed=5)[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    first = plain_llm.generate([prompt], params)[0].outputs[0].token_ids
    second_prompt = prompt + first[:10] + [5, 6]
    expected_second = plain_llm.generate([second_prompt], GREEDY)[0].outputs[0].token_ids
    llm = spec_llm(tiny_checkpoint, tiny_draft, kda_snapshot_interval=16)
    request = llm.engine.add_request(prompt, params)
    ScriptedDrafts(llm, {request: first, "second": expected_second})
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    llm.engine.add_request(second_prompt, GREEDY, request_id="second")
    out = None
    while llm.engine.has_unfinished_requests():
        out = next(iter(llm.engine.step()), out)
    assert out.num_cached_tokens == 48
    assert out.outputs[0].token_ids == expected_second
    pools_free(llm)


def test_preemption_and_aborts_stay_exact(tiny_checkpoint, tiny_draft, plain_llm, pools_free):
    """14 blocks cannot hold the three requests with their draft rows: preemptions recompute
    through prefill (context rows included); an aborted request frees everything."""
    prompts = prompts_of((60, 70, 80), seed=2)
    options = dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=192,
                   enable_prefix_caching=False, snapshot_fraction=0.0)
    longer = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    plain = tokens(plain_llm.generate(prompts, longer))
    probe = spec_llm(tiny_checkpoint, tiny_draft, kv_cache_memory=64 << 20, **options).engine
    budget = probe.state_pool.num_slots * probe.state_pool.spec.bytes_per_slot() \
        + 14 * probe.kv_pool.shape[1]
    llm = spec_llm(tiny_checkpoint, tiny_draft, kv_cache_memory=budget, **options)
    assert llm.engine.block_pool.num_blocks == 14
    ids = [llm.engine.add_request(p, longer) for p in prompts]
    ScriptedDrafts(llm, dict(zip(ids, plain)))
    llm.engine.add_request(prompts[0][:20], SamplingParams(max_tokens=50), request_id="aborted")
    outputs, steps = {}, 0
    while llm.engine.has_unfinished_requests():
        steps += 1
        if steps == 4:
            llm.engine.abort_request("aborted")
        for out in llm.engine.step():
            outputs[out.request_id] = out
    assert [outputs[i].outputs[0].token_ids for i in ids] == plain
    assert llm.engine.scheduler.num_preemptions > 0
    pools_free(llm)


def test_kda_state_and_logprobs_after_rejections_equal_the_plain_runs(tiny_checkpoint,
                                                                     tiny_draft, plain_llm):
    """After every verify step, the request's KDA state (all layers, recurrent and conv) equals
    the plain engine's at the same number of computed tokens, and every verified token's
    logprobs equal the plain run's."""
    prompt = prompts_of((30,), seed=9)[0]
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=2)
    engine = plain_llm.engine
    engine.add_request(prompt, params, request_id="r")
    states, seq = {}, engine.scheduler.waiting[0]
    while engine.has_unfinished_requests():
        want = next(iter(engine.step()))
        if not seq.is_finished:
            pool = engine.state_pool
            states[seq.num_computed_tokens] = (pool.recurrent[:, seq.state_slot].clone(),
                                               pool.conv[:, seq.state_slot].clone())
    want = want.outputs[0]
    llm = spec_llm(tiny_checkpoint, tiny_draft)
    engine = llm.engine
    engine.add_request(prompt, params, request_id="r")
    ScriptedDrafts(llm, {"r": want.token_ids})
    seq, compared = engine.scheduler.waiting[0], 0
    while engine.has_unfinished_requests():
        got = next(iter(engine.step()))
        if seq.is_finished or seq.num_computed_tokens not in states:
            continue
        recurrent, conv = states[seq.num_computed_tokens]
        pool = engine.state_pool
        assert (pool.recurrent[:, seq.state_slot] - recurrent).abs().max() \
            <= 1e-5 * recurrent.abs().max()
        assert (pool.conv[:, seq.state_slot] - conv).abs().max() <= 1e-5 * conv.abs().max()
        compared += 1
    got = got.outputs[0]
    assert got.token_ids == want.token_ids and compared >= 2
    for a, b in zip(got.logprobs, want.logprobs):
        assert a.top_token_ids == b.top_token_ids and abs(a.logprob - b.logprob) < 1e-4
    assert engine.speculation_stats().num_accepted_tokens > 0


def test_min_tokens_decodes_without_speculation_until_reached(tiny_checkpoint, tiny_draft,
                                                              caplog):
    params = SamplingParams(temperature=0.0, max_tokens=7, min_tokens=5)
    llm = spec_llm(tiny_checkpoint, tiny_draft)
    with caplog.at_level("INFO", logger="atomk31.engine.speculative"):
        out = llm.generate([prompts_of((12,))[0]], params)[0]
    assert len(out.outputs[0].token_ids) >= 5
    assert "decodes without speculation until its min_tokens (5) are out" in caplog.text
    assert llm.engine.speculation_stats().num_verify_steps > 0   # after the first 5 tokens
