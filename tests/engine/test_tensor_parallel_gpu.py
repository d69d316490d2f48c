"""TP2, EP2, DCP2 and token-sharded prefill on two GPUs (NCCL / RCCL) equal one GPU (issue 18).

The CPU tests (test_tensor_parallel.py, test_decode_context_parallel.py) prove the algorithms
with gloo; this runs the same engine over NCCL with the Triton kernels, float32 compute and
cache, on the tiny checkpoint: greedy tokens equal, sampled logits within 1e-4 of the largest
(GPU kernels sum in their own order). Skipped with fewer than two GPUs.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from sampled_logits import SampledLogits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs; fewer are visible to torch")]

OPTIONS = dict(block_size=16, kernel_backend="triton", device="cuda", dtype="float32",
               kv_cache_dtype="fp32", kv_cache_memory=256 << 20, max_num_seqs=8)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def prompts():
    g = torch.Generator().manual_seed(18)
    return [torch.randint(0, 768, (n,), generator=g).tolist() for n in (3, 40, 90, 130)]


def generate(llm):
    recorder = SampledLogits(llm)
    return [o.outputs[0].token_ids for o in llm.generate(prompts(), GREEDY)], recorder


@pytest.fixture(scope="module")
def one_gpu(tiny_checkpoint):
    llm = LLM(tiny_checkpoint, **OPTIONS)
    llm.engine.runner.graphs = None          # the parallel engines run eagerly
    return generate(llm)


@pytest.mark.parametrize("flags", [
    dict(tensor_parallel_size=2), dict(tensor_parallel_size=2, enable_expert_parallel=True),
    dict(tensor_parallel_size=2, decode_context_parallel_size=2),
    dict(tensor_parallel_size=2, token_sharded_prefill_min_tokens=32),
], ids=["tp2", "ep2", "dcp2", "tp2-token-sharded"])
def test_two_gpus_equal_one(tiny_checkpoint, one_gpu, pools_free, flags):
    with LLM(tiny_checkpoint, **OPTIONS, **flags) as llm:
        tokens, logits = generate(llm)
        pools_free(llm)
    assert tokens == one_gpu[0]
    assert logits.compare(one_gpu[1]) <= 1e-4
