"""Chunked prefill, prefix caching with KDA snapshots, preemption, seeds and stops (issue #3).

Each test compares against the same engine run without the feature (or against the oracle's
tokens), and checks that every block and state slot is free afterwards.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.reference import ReferenceModel

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def prompts_of(lengths, seed=0, vocab=768):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def tokens(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def oracle_tokens(tiny_checkpoint):
    """Greedy tokens of the oracle for `prompts_of((3, 50, 150, 300))`."""
    ref = ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8")
    return [ref.greedy(torch.tensor(p), GREEDY.max_tokens) for p in prompts_of((3, 50, 150, 300))]


def test_chunked_prefill_with_a_32_token_budget(tiny_checkpoint, oracle_tokens, pools_free):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_num_batched_tokens=32)
    steps = []
    original = llm.engine.scheduler.schedule

    def schedule():
        scheduled = original()
        steps.append(sum(item.num_new_tokens for item in scheduled))
        return scheduled

    llm.engine.scheduler.schedule = schedule
    assert tokens(llm.generate(prompts_of((3, 50, 150, 300)), GREEDY)) == oracle_tokens
    assert max(steps) <= 32 and len(steps) >= 503 // 32, steps
    pools_free(llm)


def test_prefix_cache_hit_restores_kda_state(tiny_checkpoint, record_logits, pools_free):
    """A second request sharing a 100-token prefix reuses 6 blocks of 16 (96 tokens): their
    latent rows and the KDA state snapshot at token 96; only the rest is computed."""
    shared = prompts_of((100,), seed=3)[0]
    first, second = shared + [5, 6, 7], shared + [9, 10, 11, 12]
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch")
    recorder = record_logits(llm)
    out1 = llm.generate([first], GREEDY)[0]
    out2 = llm.generate([second], GREEDY)[0]
    assert out1.num_cached_tokens == 0
    assert out2.num_cached_tokens == 96
    # the model computed only the 8 uncached prompt tokens + 4 decode steps for request 2
    assert recorder.num_computed[out2.request_id] == len(second) - 96 + GREEDY.max_tokens - 1
    cold = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch",
               enable_prefix_caching=False)
    assert cold.generate([second], GREEDY)[0].outputs[0].token_ids == out2.outputs[0].token_ids
    assert llm.engine.block_pool.hit_rate() == pytest.approx(96 / (len(first) + len(second)))
    pools_free(llm)
    pools_free(cold)


def test_prefix_cache_inside_one_batch_and_with_n(tiny_checkpoint, pools_free):
    """n=3 completions of one prompt and a prompt repeated in the batch give the tokens of
    separate runs (greedy: all equal), with the pools free afterwards."""
    prompt = prompts_of((70,), seed=4)[0]
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch")
    outs = llm.generate([prompt, prompt], SamplingParams(n=3, temperature=0.0, max_tokens=4,
                                                         ignore_eos=True))
    alone = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch",
                enable_prefix_caching=False).generate([prompt], GREEDY)[0].outputs[0].token_ids
    for out in outs:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert [c.token_ids for c in out.outputs] == [alone[:4]] * 3
    pools_free(llm)


def test_preemption_resumes_exactly(tiny_checkpoint, oracle_tokens, pools_free):
    """26 blocks of 16 tokens cannot hold the four prompts (503 tokens + outputs) at once."""
    options = dict(block_size=16, kernel_backend="torch", max_num_batched_tokens=64,
                   max_num_seqs=4, max_model_len=320, enable_prefix_caching=False,
                   snapshot_fraction=0.0)
    probe = LLM(tiny_checkpoint, kv_cache_memory=64 << 20, **options).engine
    budget = 4 * probe.state_pool.spec.bytes_per_slot() + 26 * probe.kv_pool.shape[1]
    llm = LLM(tiny_checkpoint, kv_cache_memory=budget, **options)
    assert llm.engine.block_pool.num_blocks == 26
    assert tokens(llm.generate(prompts_of((3, 50, 150, 300)), GREEDY)) == oracle_tokens
    assert llm.engine.scheduler.num_preemptions > 0
    pools_free(llm)


def test_seeded_sampling_is_reproducible_across_batches(tiny_checkpoint, pools_free):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch")
    seeded = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7, max_tokens=8,
                            ignore_eos=True)
    prompt = prompts_of((30,), seed=5)[0]
    alone = llm.generate([prompt], seeded)[0].outputs[0].token_ids
    others = prompts_of((10, 80), seed=6)
    mixed = llm.generate([others[0], prompt, others[1]],
                         [SamplingParams(temperature=1.0, max_tokens=8), seeded,
                          SamplingParams(temperature=0.5, max_tokens=3)])
    assert mixed[1].outputs[0].token_ids == alone
    reseeded = llm.generate([prompt], SamplingParams(temperature=0.8, top_p=0.9, top_k=50,
                                                     seed=8, max_tokens=8, ignore_eos=True))
    assert reseeded[0].outputs[0].token_ids != alone   # the seed matters
    pools_free(llm)


def test_stop_tokens_and_max_tokens(tiny_checkpoint, pools_free):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch")
    prompt = prompts_of((20,), seed=9)[0]
    free_run = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6,
                                                     ignore_eos=True))[0].outputs[0]
    assert free_run.finish_reason == "length" and len(free_run.token_ids) == 6
    stop_at = free_run.token_ids[2]
    stopped = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6,
                                                    stop_token_ids=[stop_at]))[0].outputs[0]
    first = free_run.token_ids.index(stop_at)
    assert stopped.token_ids == free_run.token_ids[: first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at
    pools_free(llm)


def test_prompt_over_the_context_length_is_refused(tiny_checkpoint, pools_free):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_model_len=128)
    with pytest.raises(ValueError, match="the prompt has 120 tokens and asks for 16 more "
                                         r"\(136 in all\), over the context length of 128"):
        llm.generate([[1] * 120], SamplingParams(max_tokens=16))
    pools_free(llm)


def test_abort_frees_everything(tiny_checkpoint, pools_free):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch")
    engine = llm.engine
    engine.add_request(prompts_of((90,))[0], SamplingParams(max_tokens=50), request_id="a")
    engine.add_request(prompts_of((10,))[0], SamplingParams(max_tokens=50), request_id="b")
    engine.step()
    engine.step()
    engine.abort_request("a")
    engine.abort_request("b")
    pools_free(llm)


def test_prompt_logprobs_over_chunks_equal_the_oracle(tiny_checkpoint, pools_free):
    """Issue 19 (lm-eval's loglikelihood needs them): the logprob of every prompt token given
    the ones before it, computed across prefill chunks of 32 tokens and never skipped by the
    prefix cache (a second identical request computes its whole prompt again)."""
    prompt = prompts_of((60,), seed=8)[0]
    logprobs = ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8").forward(
        torch.tensor(prompt)).log_softmax(-1)
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_num_batched_tokens=32,
              kv_cache_memory=192 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3, ignore_eos=True)
    for attempt in range(2):
        [out] = llm.generate([prompt], params)
        entries = out.prompt_logprobs
        assert out.num_cached_tokens == 0 and entries[0] is None and len(entries) == 60
        got = torch.tensor([e.logprob for e in entries[1:]])
        expected = logprobs[torch.arange(59), torch.tensor(prompt[1:])]
        assert (got - expected).abs().max() < 2e-3, attempt
        assert all(e.token_id == t and len(e.top_token_ids) == 3
                   for e, t in zip(entries[1:], prompt[1:]))
        assert [e.top_token_ids[0] for e in entries[1:]] == logprobs[:59].argmax(-1).tolist()
    pools_free(llm)
