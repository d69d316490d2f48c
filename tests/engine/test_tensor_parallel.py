"""Tensor and expert parallelism on CPU (gloo) equal one process (issue 18).

`LLM(..., tensor_parallel_size=N)` starts its N-1 other ranks itself. Each configuration's
greedy tokens must be those of one process and the logits it sampled from (every decode
position, each prompt's last) within 1e-5 of the largest logit. The tiny checkpoint has 4 MLA
and 4 KDA heads, so TP4 holds one head of each per rank; its 16 experts split 8 / 4 per rank
under EP. Prompts of 3, 40 and 90 tokens run dense attention and, past index_topk (64), the
indexer's top-k. Token-sharded prefill (a threshold of 32 tokens) must give what
head-sharded prefill gives.

The float32 engine only reorders sums across ranks (the all-reduces), so the top-k sees the
same scores up to ~1e-7; a near-tie at the top-k boundary could still flip under FP8 index
keys (see test_llm_vs_reference.py): if one of these tests fails at a single late position,
look for such a flip first.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.model import mla_layer
from sampled_logits import SampledLogits

pytestmark = pytest.mark.slow

PROMPT_LENGTHS = (3, 40, 90)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
TOLERANCE = 1e-5          # of the largest |logit|
OPTIONS = dict(block_size=16, kernel_backend="torch", kv_cache_memory=64 << 20, max_num_seqs=8)


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(18)
    return [torch.randint(0, 768, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


def generate(llm: LLM) -> tuple[list[list[int]], SampledLogits]:
    recorder = SampledLogits(llm)
    outputs = llm.generate(prompts(), GREEDY)
    return [o.outputs[0].token_ids for o in outputs], recorder


@pytest.fixture(scope="module")
def one_process(tiny_checkpoint):
    return generate(LLM(tiny_checkpoint, **OPTIONS))


@pytest.fixture(scope="module")
def tp2_head_sharded(tiny_checkpoint):
    with LLM(tiny_checkpoint, tensor_parallel_size=2, **OPTIONS) as llm:
        return generate(llm)


def test_tp2_equals_one_process(one_process, tp2_head_sharded):
    tokens, logits = tp2_head_sharded
    assert tokens == one_process[0]
    assert logits.compare(one_process[1]) <= TOLERANCE


@pytest.mark.parametrize("tp,expert_parallel", [(4, False), (2, True), (4, True)],
                         ids=["tp4", "ep2", "ep4"])
def test_tp_and_ep_equal_one_process(tiny_checkpoint, one_process, pools_free, tp,
                                     expert_parallel):
    with LLM(tiny_checkpoint, tensor_parallel_size=tp, enable_expert_parallel=expert_parallel,
             **OPTIONS) as llm:
        layer = llm.engine.model.layers[1].ffn
        assert layer.num_local_experts == (16 // tp if expert_parallel else 16)
        tokens, logits = generate(llm)
        pools_free(llm)
    assert tokens == one_process[0]
    assert logits.compare(one_process[1]) <= TOLERANCE


def test_token_sharded_prefill_equals_head_sharded(tiny_checkpoint, tp2_head_sharded,
                                                   monkeypatch, pools_free):
    calls = []
    original = mla_layer.token_sharded_attend

    def counted(mixer, x, *args):
        calls.append(x.shape[0])
        return original(mixer, x, *args)

    monkeypatch.setattr(mla_layer, "token_sharded_attend", counted)
    with LLM(tiny_checkpoint, tensor_parallel_size=2, token_sharded_prefill_min_tokens=32,
             **OPTIONS) as llm:
        tokens, logits = generate(llm)
        pools_free(llm)
        with pytest.raises(ValueError, match="already runs a distributed engine"):
            LLM(tiny_checkpoint, tensor_parallel_size=2, **OPTIONS)
    assert calls and min(calls) >= 32, "prefill steps of 32+ tokens attend token-sharded"
    assert tokens == tp2_head_sharded[0]
    assert logits.compare(tp2_head_sharded[1]) <= TOLERANCE
