"""Chunked prefill, prefix-cache hits, preemption and aborts under tensor parallelism (issue 18).

The first rank's scheduler decides all of them; the other ranks must follow exactly: the KDA
slot changes it makes between steps (a slot zeroed for a new request, a prefix snapshot
restored) are replayed on every rank before the step (``engine/step_message.py``). Each test
compares the TP2 engine's greedy tokens with one process's on the same prompts, and checks
that every block and KDA state slot is free at the end. Only the first rank keeps the
allocation state: the other ranks' pools are tensors indexed by its decisions, so "free on
the first rank" is "free on every rank".
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.cache import CacheLayoutSpec, KDAStateSpec, PackedLayout
from atomk31.config import ModelConfig

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
OPTIONS = dict(block_size=16, kernel_backend="torch", max_num_seqs=4, max_model_len=320)


def prompts_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 768, (n,), generator=g).tolist() for n in lengths]


def rank_state_bytes(checkpoint, tp: int) -> int:
    """One request's KDA state on a rank of ``tp`` (its KDA heads; float32 on CPU)."""
    config = ModelConfig.from_pretrained(checkpoint)
    heads = config.kda_num_heads // tp
    return KDAStateSpec(len(config.kda_layer_ids), heads, config.kda_head_dim,
                        config.short_conv_kernel_size, heads * config.kda_head_dim,
                        conv_dtype=torch.float32).bytes_per_slot()


def row_bytes(checkpoint) -> int:
    """One block row (every MLA layer's page of 16 tokens; float32 latents on CPU)."""
    config = ModelConfig.from_pretrained(checkpoint)
    return PackedLayout(CacheLayoutSpec(16, len(config.mla_layer_ids),
                                        latent_dtype=torch.float32)).row_bytes


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def shared_prefix_prompts():
    shared = prompts_of((100,), seed=3)[0]
    return [shared + [5, 6, 7], shared + [9, 10, 11, 12]]


@pytest.fixture(scope="module")
def one_process(tiny_checkpoint, shared_prefix_prompts):
    llm = LLM(tiny_checkpoint, kv_cache_memory=64 << 20, **OPTIONS)
    return {"chunked": tokens(llm.generate(prompts_of((3, 50, 150)), GREEDY)),
            "prefix": [tokens(llm.generate([p], GREEDY))[0] for p in shared_prefix_prompts]}


def test_chunked_prefill_prefix_hits_and_aborts_under_tp2(tiny_checkpoint, one_process,
                                                          shared_prefix_prompts, pools_free):
    with LLM(tiny_checkpoint, tensor_parallel_size=2, kv_cache_memory=64 << 20,
             max_num_batched_tokens=32, **OPTIONS) as llm:
        engine = llm.engine
        # an aborted request in the middle of its prefill frees everything it held
        aborted = engine.add_request(prompts_of((200,), seed=9)[0], GREEDY)
        engine.step()
        engine.step()
        engine.abort_request(aborted)
        pools_free(llm)
        assert tokens(llm.generate(prompts_of((3, 50, 150)), GREEDY)) == one_process["chunked"]
        first, second = (llm.generate([p], GREEDY)[0] for p in shared_prefix_prompts)
        assert second.num_cached_tokens == 96, "6 blocks of 16 and their KDA snapshot reused"
        assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == one_process["prefix"]
        pools_free(llm)


def test_preemption_resumes_exactly_under_tp2(tiny_checkpoint, one_process, pools_free):
    """14 blocks of 16 tokens cannot hold the three prompts (203 tokens + outputs, 15 blocks)
    at once: the newest sequence is preempted and recomputed."""
    options = dict(OPTIONS, enable_prefix_caching=False, snapshot_fraction=0.0,
                   max_num_batched_tokens=64, max_model_len=200)
    budget = (OPTIONS["max_num_seqs"] * rank_state_bytes(tiny_checkpoint, 2)
              + 14 * row_bytes(tiny_checkpoint))
    with LLM(tiny_checkpoint, tensor_parallel_size=2, kv_cache_memory=budget,
             **options) as llm:
        assert llm.engine.block_pool.num_blocks == 14
        assert tokens(llm.generate(prompts_of((3, 50, 150)), GREEDY)) == one_process["chunked"]
        assert llm.engine.scheduler.num_preemptions > 0
        pools_free(llm)


def test_forks_and_prompt_logprobs_under_tp2(tiny_checkpoint, pools_free):
    """n > 1 copies the prompt's partial last block to each fork: every rank repeats the copy
    on its own pool before the next step (a rank that skipped it would decode the forks from
    stale rows). Prompt logprobs ask every rank for the same extra logits rows (the LM head is
    vocabulary-parallel: one all-gather over all of them), over prefill chunks of 32."""
    prompt = prompts_of((47,), seed=5)[0]          # 2 blocks of 16 and 15 tokens of a third
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, n=3,
                            logprobs=1, prompt_logprobs=2)
    options = dict(OPTIONS, max_num_batched_tokens=32, kv_cache_memory=64 << 20)
    [expected] = LLM(tiny_checkpoint, **options).generate([prompt], params)
    with LLM(tiny_checkpoint, tensor_parallel_size=2, **options) as llm:
        [got] = llm.generate([prompt], params)
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in expected.outputs]
        decoded = [(g.logprob, e.logprob) for gc, ec in zip(got.outputs, expected.outputs)
                   for g, e in zip(gc.logprobs, ec.logprobs)]
        assert max(abs(g - e) for g, e in decoded) < 1e-4
        assert len(got.outputs) == 3 and got.prompt_logprobs[0] is None
        pairs = list(zip(got.prompt_logprobs[1:], expected.prompt_logprobs[1:]))
        assert len(pairs) == 46
        assert all(g.top_token_ids == e.top_token_ids for g, e in pairs)
        assert max(abs(g.logprob - e.logprob) for g, e in pairs) < 1e-4
        pools_free(llm)
