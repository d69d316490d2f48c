"""The shipped DSpark draft of the built-in model (atomk31/demo/weights/dspark/, issue 21): the
`"builtin"` alias loads it, greedy outputs on task prompts are those without speculation token
for token, and its drafts are accepted (mean acceptance length well above 1, which a random
draft does not reach)."""

import pytest

from atomk31 import LLM, SamplingParams
from atomk31.checkpoint import Tokenizer
from atomk31.demo.render import prompt_segments
from atomk31.demo.shipped import SHIPPED_DIR
from atomk31.demo.tasks import generate
from atomk31.speculative_config import BUILTIN_DRAFT_DIR

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def prompts():
    tokenizer = Tokenizer.from_pretrained(SHIPPED_DIR)
    return [tokenizer.encode_segments(prompt_segments(generate(family, "eval", 0, 3)))
            for family in ("arithmetic", "tools", "chat")]


def test_builtin_draft_keeps_greedy_outputs_and_is_accepted(prompts):
    plain = LLM(kernel_backend="torch")
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)]
    spec = LLM(kernel_backend="torch",
               speculative_config={"model": "builtin", "num_speculative_tokens": 5})
    assert spec.engine.config.speculative.model == str(BUILTIN_DRAFT_DIR)
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, GREEDY)]
    assert got == expected
    stats = spec.engine.speculation_stats()
    assert stats.num_verify_steps > 0 and stats.mean_acceptance_length > 1.5, stats
