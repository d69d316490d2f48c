"""The whole engine on the Triton backend, every kernel run by Triton's interpreter on CPU,
in float32, equals the oracle: the kernels' semantics, as wired into the model.

The registry refuses Triton kernels on CPU devices (they need a GPU to be worth running), so
the test lets every implementation through. Prompts stay within index_topk (64 on the tiny
model): dense attention only, no top-k near-tie can flip, so every logit must agree to
TOLERANCE. On the H200 the same kernels run compiled (test_llm_vs_reference.py's float32 test
with the Triton backend, and tests/engine/test_op_shadow.py op by op).
"""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.ops import registry
from atomk31.reference import ReferenceModel

TOLERANCE = 1e-4  # of the largest |logit| (§9 #2); measured here: 1.8e-6 .. 3.5e-6
PROMPT_LENGTHS = (1, 7, 40)  # with 2 new tokens, all under index_topk = 64


@pytest.fixture
def triton_on_cpu(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("interpreter test: runs where no GPU is visible (the gpu tests cover this)")
    real = registry.Implementation.reason_against

    def triton_on_any_device(self, context, step, shape):
        if self.target == "triton" and (self.shapes is None or shape in self.shapes):
            return None          # the device and dtype checks let through, the shape classes kept
        return real(self, context, step, shape)
    monkeypatch.setattr(registry.Implementation, "reason_against", triton_on_any_device)


def test_float32_engine_on_interpreted_triton_kernels_equals_reference(
        tiny_checkpoint, record_logits, pools_free, triton_on_cpu):
    llm = LLM(tiny_checkpoint, block_size=16, dtype="float32", kv_cache_dtype="fp32",
              kernel_backend="triton", device="cpu", kv_cache_memory=256 << 20)
    backends = {op: target for op, _, target, _, _ in llm.engine.kernels.eager.describe()}
    assert backends["dense_mla"] == "triton" and backends["kda_prefill"] == "triton", backends
    recorder = record_logits(llm)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 768, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2,
                                                   ignore_eos=True))
    ref = ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8")
    for prompt, out in zip(prompts, outputs):
        tokens = out.outputs[0].token_ids
        ref_logits = ref.forward(torch.tensor(prompt + tokens))
        assert tokens == ref_logits[len(prompt) - 1:-1].argmax(-1).tolist()
        got = recorder.sequence_logits(out.request_id)
        error = ((got - ref_logits[: got.shape[0]]).abs().max() / ref_logits.abs().max()).item()
        assert error <= TOLERANCE, f"prompt of {len(prompt)} tokens: error {error:.2e}"
    pools_free(llm)
