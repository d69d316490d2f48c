"""The engine equals the oracle (issue #3; MODEL_SPEC §9 #2 says how to compare).

With float32 compute the engine's greedy tokens must be the reference's and its logits must agree
to 1e-4 of the largest logit; the reference simulates the engine's storage formats (FP8 index
keys; the FP8 latent when the cache is FP8, §9 #15).

FP8 index keys make one caveat unavoidable. Quantization is discontinuous: a 1e-7 difference in
an index query (a different summation order, which §9 #5 leaves free) occasionally moves a value
across an FP8 rounding boundary, shifts one score by a few percent and swaps a near-tie at the
top-k boundary. From that position on, the selection differs and the KDA states carry the
difference forward. So: tokens must match everywhere; logits must match to 1e-4 at every
position before the first such flip, which can only happen where selection is active
(position >= index_topk); after it they must stay within FLIPPED_TOLERANCE.

An FP8 latent cache adds the same kind of rounding flip to every attended row, dense positions
included, and the tiny random model amplifies it (§9 #2): FP8 and BF16 storage are therefore
checked teacher-forced, like BF16 compute, against the oracle simulating the same formats.
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.reference import ReferenceModel

PROMPT_LENGTHS = (1, 7, 64, 65, 130, 257, 400, 600)   # around block size 16 and index_topk 64
NUM_NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
TOLERANCE = 1e-4            # of the largest |logit| (§9 #2)
FLIPPED_TOLERANCE = 0.2     # after a top-k near-tie flip (see the module docstring)


def random_prompts(lengths, vocab: int = 768, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def compare_with_reference(recorder, ref, prompts, outputs, first_flip: int) -> float:
    """Assert the contract above; -> the fraction of positions within TOLERANCE."""
    num_close = num_positions = 0
    for prompt, out in zip(prompts, outputs):
        tokens = out.outputs[0].token_ids
        ref_logits = ref.forward(torch.tensor(prompt + tokens))
        # teacher-forced greedy: each engine token is the oracle's argmax at its position,
        # which is what ReferenceModel.greedy produces, token for token
        expected = ref_logits[len(prompt) - 1:-1].argmax(-1).tolist()
        assert tokens == expected, f"prompt of {len(prompt)} tokens: {tokens} != {expected}"
        got = recorder.sequence_logits(out.request_id)
        scale = ref_logits.abs().max().item()
        err = (got - ref_logits[: got.shape[0]]).abs().amax(-1) / scale
        far = (err > TOLERANCE).nonzero().flatten().tolist()
        if far:
            assert far[0] >= first_flip, (
                f"prompt of {len(prompt)} tokens: logits differ by {err[far[0]]:.2e} of the "
                f"largest at position {far[0]} (< {first_flip}, where no flip can occur)")
        assert err.max() <= FLIPPED_TOLERANCE, f"prompt of {len(prompt)}: error {err.max():.3g}"
        num_close += len(err) - len(far)
        num_positions += len(err)
    return num_close / num_positions


def test_float32_batch_equals_reference(tiny_checkpoint, record_logits, pools_free, backend):
    # On the H200 with the Triton backend (2026-11-29, session 3): logits within 1e-6 .. 6e-6
    # of the oracle's largest at every position before the first top-k flip; the op-by-op
    # check that found no kernel differing is tests/engine/test_op_shadow.py.
    llm = LLM(tiny_checkpoint, block_size=16, dtype="float32", kv_cache_dtype="fp32", **backend)
    recorder = record_logits(llm)
    prompts = random_prompts(PROMPT_LENGTHS)
    outputs = llm.generate(prompts, GREEDY)
    ref = ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8")
    # only top-k selection can flip, and only from position index_topk on
    close = compare_with_reference(recorder, ref, prompts, outputs,
                                   llm.engine.model_config.index_topk)
    # How far a flip cascades depends on the machine's summation order: 96% of positions
    # stayed within TOLERANCE here (torch 2.13, x86 CPU), 66% on the H200 host's CPU with
    # torch 2.11 (2026-11-29). Half still catches any systematic error.
    assert close >= 0.5, f"only {close:.1%} of positions within {TOLERANCE} of the oracle"
    pools_free(llm)


@pytest.mark.parametrize("dtype, kv_cache_dtype", [
    ("float32", "fp8"), ("bfloat16", "fp8"), ("bfloat16", "bf16")])
def test_teacher_forced_storage_formats(tiny_checkpoint, record_logits, pools_free, dtype,
                                        kv_cache_dtype, backend):
    """Fed the oracle's tokens (§9 #2b): top-1 agrees wherever the oracle's top-1/top-2 gap
    exceeds 0.1 at every dense position (< index_topk) and at >= 95% of all positions (sparse
    selection can flip, see the module docstring); dense logits stay within 15% of the largest
    |logit|. The oracle simulates the FP8 latent when the cache is FP8 (§9 #15)."""
    llm = LLM(tiny_checkpoint, block_size=16, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
              **backend)
    recorder = record_logits(llm)
    ref = ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8",
                                         latent_format="fp8" if kv_cache_dtype == "fp8" else "exact")
    topk = llm.engine.model_config.index_topk
    prompts = random_prompts((40, 64, 200), seed=1)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1))
    num_agree = num_clear = 0
    for prompt, out in zip(prompts, outputs):
        ref_logits = ref.forward(torch.tensor(prompt))
        got = recorder.sequence_logits(out.request_id)[: len(prompt)]
        top2 = ref_logits.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.1
        agree = got.argmax(-1) == ref_logits.argmax(-1)
        dense_miss = (~agree & clear)[:topk].nonzero().flatten().tolist()
        assert not dense_miss, f"top-1 differs at clear dense positions {dense_miss}"
        err = ((got - ref_logits)[:topk].abs().max() / ref_logits.abs().max()).item()
        assert err < 0.15, f"dense logits differ by {err:.3f} of the largest"
        num_agree += int((agree & clear).sum())
        num_clear += int(clear.sum())
    assert num_agree >= 0.95 * num_clear, f"top-1 agrees at {num_agree}/{num_clear} clear positions"
    pools_free(llm)
