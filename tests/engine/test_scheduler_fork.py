"""engine/scheduler.py: n > 1 completions fork from one prefill (issue 19).

Before issue 19 every completion of a request recomputed the prompt. Now the prompt is computed
once; the other completions share its full blocks, copy its last partial block and its KDA
state, and must generate exactly what n independent requests generate."""

from collections import Counter

import pytest
import torch

from atomk31 import LLM, SamplingParams

BLOCK = 16
CACHE_BYTES = 192 << 20   # 64 KDA states and the blocks these tests need: keeps RSS small


def tiny_llm(checkpoint, **options) -> LLM:
    return LLM(checkpoint, block_size=BLOCK, kernel_backend="torch", kv_cache_memory=CACHE_BYTES,
               **options)


def count_computed_tokens(llm: LLM) -> Counter:
    """Tokens the model computes per request id, counted as the scheduler completes steps."""
    counts: Counter = Counter()
    scheduler = llm.engine.scheduler
    original = scheduler.complete

    def complete(scheduled):
        for item in scheduled:
            counts[item.seq.request_id] += item.num_new_tokens
        original(scheduled)

    scheduler.complete = complete
    return counts


def prompt_of(length: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 768, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def independent(tiny_checkpoint):
    """`independent(prompt, params)`: the tokens of each choice run as its own n=1 request
    (choice i with seed + i) on an engine without prefix caching."""
    llm = tiny_llm(tiny_checkpoint, enable_prefix_caching=False)

    def run(prompt: list[int], params: SamplingParams) -> list[list[int]]:
        singles = [SamplingParams(**{**vars(params), "n": 1, "seed": None if params.seed is None
                                     else params.seed + i}) for i in range(params.n)]
        return [out.outputs[0].token_ids for out in llm.generate([prompt] * params.n, singles)]
    return run


GREEDY_4 = SamplingParams(n=4, temperature=0.0, max_tokens=4, ignore_eos=True)
SEEDED_3 = SamplingParams(n=3, temperature=0.9, top_k=50, seed=11, max_tokens=4,
                          ignore_eos=True)


@pytest.mark.parametrize("length, params", [(70, GREEDY_4), (48, SEEDED_3)],
                         ids=["greedy-partial-block", "seeded-block-aligned"])
def test_fork_equals_independent_requests_and_computes_the_prompt_once(
        tiny_checkpoint, independent, pools_free, length, params):
    """Issue 19: n = 128 recomputed the prompt 128 times; now the prompt's tokens are computed
    once and each choice matches its own independent request token for token."""
    llm = tiny_llm(tiny_checkpoint)
    computed = count_computed_tokens(llm)
    prompt = prompt_of(length, seed=length)
    [out] = llm.generate([prompt], params)
    assert [c.token_ids for c in out.outputs] == independent(prompt, params)
    # the prompt once, then each choice computes its own generated tokens but the last
    assert computed[out.request_id] == length + params.n * (params.max_tokens - 1)
    pools_free(llm)


def test_fork_with_max_tokens_1_takes_no_fork_resources(tiny_checkpoint, pools_free):
    llm = tiny_llm(tiny_checkpoint)
    computed = count_computed_tokens(llm)
    [out] = llm.generate([prompt_of(40)], SamplingParams(n=128, temperature=1.0, seed=3,
                                                         max_tokens=1, ignore_eos=True))
    assert len(out.outputs) == 128 and all(len(c.token_ids) == 1 for c in out.outputs)
    assert len({c.token_ids[0] for c in out.outputs}) > 1, "each choice samples its own token"
    assert computed[out.request_id] == 40
    pools_free(llm)


def test_fork_without_room_recomputes_and_still_matches(tiny_checkpoint, independent,
                                                        pools_free):
    """max_num_seqs=2 leaves no batch seat for the third choice: it waits and recomputes its
    prompt and first token, as a preempted sequence does."""
    llm = tiny_llm(tiny_checkpoint, max_num_seqs=2)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=3, ignore_eos=True)
    prompt = prompt_of(30, seed=2)
    [out] = llm.generate([prompt], params)
    assert [c.token_ids for c in out.outputs] == independent(prompt, params)
    pools_free(llm)


def test_forks_share_full_blocks_and_copy_the_partial_one(tiny_checkpoint, pools_free):
    llm = tiny_llm(tiny_checkpoint)
    engine = llm.engine
    engine.add_request(prompt_of(40), SamplingParams(n=3, temperature=0.0, max_tokens=8,
                                                     ignore_eos=True), request_id="r")
    engine.step()
    parent, *forks = engine.requests["r"].seqs
    pool = engine.block_pool
    assert [f.num_computed_tokens for f in forks] == [40, 40]
    for block in parent.block_table[:2]:                      # 40 = 2 full blocks + 8 tokens
        assert pool.ref_count(block) == 3
        assert all(block in f.block_table for f in forks)
    partials = {parent.block_table[2]} | {f.block_table[2] for f in forks}
    assert len(partials) == 3 and all(pool.ref_count(b) == 1 for b in partials)
    assert len({parent.state_slot} | {f.state_slot for f in forks}) == 3
    for fork in forks:
        assert torch.equal(engine.kv_pool[fork.block_table[2]],
                           engine.kv_pool[parent.block_table[2]])
    engine.abort_request("r")
    pools_free(llm)


@pytest.mark.parametrize("steps", [0, 3], ids=["before-prefill", "mid-prefill-and-forked"])
def test_abort_frees_every_fork(tiny_checkpoint, pools_free, steps):
    llm = tiny_llm(tiny_checkpoint, max_num_batched_tokens=32)
    engine = llm.engine
    engine.add_request(prompt_of(45), SamplingParams(n=4, max_tokens=20, ignore_eos=True),
                       request_id="r")
    engine.add_request(prompt_of(20), SamplingParams(n=2, max_tokens=20), request_id="s")
    for _ in range(steps):
        engine.step()
    engine.abort_request("r")
    engine.abort_request("s")
    assert not engine.has_unfinished_requests()
    pools_free(llm)
