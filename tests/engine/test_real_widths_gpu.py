"""The engine at the model's real widths with default flags, as a user runs it (issue 16).

A 3-layer checkpoint with the full layer widths (hidden 7168, 96 MLA and KDA heads, indexer
32 x 128 with top-k 2048, latent MoE 3584 / 3072 with 16 of 32 experts active, the real
vocabulary), drawn on the GPU (`make-checkpoint --preset proxy-mini --device cuda`), served by
`LLM(dir, block_size=128, device="cuda")`: BF16, FP8 latent and index keys, the default kernel
backend (hopper on an H200) and CUDA graphs on. Prompts of 1, 100, 2047, 2049 and 5000 tokens
in batches of 1, 3 and 16 requests cover prefill chunks, dense and sparse attention, decode
across the top-k edge and graph shapes of 1, 4 and 16 rows.

Checks:
* graphs vs the same engine with ``enforce_eager``: greedy tokens equal. BF16 with random
  weights has near-ties, so a divergence is accepted only where the eager run's top two
  log-probabilities lie within NEAR_TIE of each other, and the rest of that sequence is then
  not compared. Every captured shape passed its replay check (no refused shapes).
* teacher-forced against the torch backend (the ops' definitions, same formats, eager): the
  torch engine continues prompt + the graph run's first j tokens and must give the graph run's
  token j a log-probability within LOGPROB_BOUND of the graph run's, inside its top 5.
"""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.checkpoint import make_checkpoint

pytestmark = pytest.mark.gpu

PROMPT_LENGTHS = (1, 100, 2047, 2049, 5000)
BATCHES = {1: (5000,), 3: (1, 2049, 100), 16: PROMPT_LENGTHS * 3 + (2047,)}
MAX_TOKENS = 8
NEAR_TIE = 0.05            # nats between the eager run's top two tokens
LOGPROB_BOUND = 0.3        # nats: BF16 over 3 layers, other kernels and summation orders
VOCAB_FOR_PROMPTS = 160000


@pytest.fixture(scope="module")
def real_width_checkpoint(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() else tmp_path_factory.mktemp("real_width")
    out = make_checkpoint("proxy-mini", seed=0, out=root / "atomk31-proxy-mini",
                          progress=False, device="cuda")
    yield out
    shutil.rmtree(out, ignore_errors=True)


def prompts_for(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB_FOR_PROMPTS, (n,), generator=generator).tolist()
            for n in lengths]


def generate_all(checkpoint, **kwargs) -> tuple[dict, dict]:
    """{batch size: outputs} for every batch of BATCHES, and facts about the engine's graphs."""
    # a fixed cache (the prompts need under 1 GiB of it), so that two engines fit side by side
    # should the first one's memory outlive `del`: a graphed engine's did on the H200 (open)
    llm = LLM(checkpoint, block_size=128, device="cuda", kv_cache_memory=16 << 30, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outputs = {n: llm.generate(prompts_for(lengths, seed=n), params)
               for n, lengths in BATCHES.items()}
    graphs = llm.engine.runner.graphs
    facts = {"replays": graphs.num_replays if graphs else 0,
             "shapes": sorted(graphs.graphs) if graphs else [],
             "refused": dict(graphs.refused) if graphs else {}}
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outputs, facts


@pytest.fixture(scope="module")
def runs(real_width_checkpoint):
    graph_outputs, graph_facts = generate_all(real_width_checkpoint)
    eager_outputs, _ = generate_all(real_width_checkpoint, enforce_eager=True)
    return graph_outputs, graph_facts, eager_outputs


def test_graphs_are_captured_and_pass_their_replay_check(runs):
    _, facts, _ = runs
    assert facts["replays"] > 0 and not facts["refused"], facts
    assert {batch for batch, _ in facts["shapes"]} >= {1, 4, 16}, facts["shapes"]


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_graph_greedy_tokens_equal_eager(runs, batch):
    graph_outputs, _, eager_outputs = runs
    for got_out, want_out in zip(graph_outputs[batch], eager_outputs[batch]):
        got, want = got_out.outputs[0], want_out.outputs[0]
        length = len(got_out.prompt_token_ids)
        for step, (a, b) in enumerate(zip(got.token_ids, want.token_ids)):
            if a == b:
                continue
            top = want.logprobs[step].top_logprobs
            margin = top[0] - top[1]
            assert margin <= NEAR_TIE, (f"prompt of {length}: token {step} is {a} with graphs, "
                                        f"{b} eager, eager margin {margin:.3f} nats")
            break                  # a near-tie: the sequences may part from here


def test_teacher_forced_logprobs_agree_with_the_torch_backend(runs, real_width_checkpoint):
    graph_outputs, _, _ = runs
    llm = LLM(real_width_checkpoint, block_size=128, device="cuda", kernel_backend="torch",
              max_num_batched_tokens=8192)
    cases = [(graph_outputs[1][0], (0, MAX_TOKENS - 1)), (graph_outputs[3][1], (MAX_TOKENS - 1,)),
             (graph_outputs[3][2], (0,))]
    worst = 0.0
    for out, steps in cases:
        completion = out.outputs[0]
        for step in steps:
            prompt = out.prompt_token_ids + completion.token_ids[:step]
            forced = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1,
                                                           logprobs=5))[0].outputs[0]
            record = forced.logprobs[0]
            token = completion.token_ids[step]
            assert token in record.top_token_ids, (
                f"prompt of {len(prompt)}: the graph run's token {token} is not in the torch "
                f"backend's top 5 {record.top_token_ids}")
            torch_logprob = record.top_logprobs[record.top_token_ids.index(token)]
            difference = abs(torch_logprob - completion.logprobs[step].logprob)
            worst = max(worst, difference)
            assert difference <= LOGPROB_BOUND, (f"prompt of {len(prompt)}: logprob of token "
                                                 f"{token} differs by {difference:.3f} nats")
    print(f"largest teacher-forced logprob difference: {worst:.4f} nats")
