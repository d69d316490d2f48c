"""The engine's DSpark draft (atomk31/model/dspark.py) against the float32 reference draft
(atomk31/reference/dspark.py), issue 21: same target states in, the block pass's base logits
within 1e-5 (relative to their largest magnitude) and the same greedy drafts; after a verify
step too (context rows written by a verify pass); the tapped target states equal the oracle's
hidden states (§4.3); the rotary embedding of both pairings equals the reference's."""

import pytest
import torch

from atomk31 import LLM, SamplingParams
from atomk31.checkpoint.dspark_writer import draft_preset_config
from atomk31.model.dspark import rotate, yarn_inverse_frequencies, yarn_mscale
from atomk31.reference import ReferenceModel
from atomk31.reference.dspark import ReferenceDraft, apply_yarn_rope, load_draft_config
from atomk31.speculative_config import DraftConfig


class TapRecorder:
    """Keeps, per position, the tapped target states of the last forward that computed it."""

    def __init__(self, llm: LLM):
        spec = llm.engine.speculative
        self.by_position: dict[int, torch.Tensor] = {}
        original = spec.runner.model.forward_with_taps

        def forward_with_taps(batch, *args):
            logits, aux = original(batch, *args)
            for i, p in enumerate(batch.positions.tolist()):
                self.by_position[p] = aux[i].clone()
            return logits, aux

        spec.runner.model.forward_with_taps = forward_with_taps

    def aux(self, num_positions: int) -> torch.Tensor:
        return torch.stack([self.by_position[p] for p in range(num_positions)])


@pytest.fixture(scope="module")
def references(tiny_checkpoint, tiny_draft):
    return (ReferenceModel.from_pretrained(tiny_checkpoint),
            ReferenceDraft.from_pretrained(tiny_draft))


def check_block(llm, references, item, recorder):
    target, draft = references
    proposer = llm.engine.speculative.proposer
    seq, k = item.seq, item.num_draft_tokens
    got = proposer.draft.block_logits(proposer.batch([item]), proposer.caches,
                                      llm.engine.kernels.eager)
    anchor = seq.all_token_ids[seq.num_computed_tokens]
    want = draft.block_logits(recorder.aux(seq.num_computed_tokens), anchor, k,
                              target.weights.embed_tokens, target.weights.lm_head)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    drafts = proposer.propose([item], [None], llm.engine.kernels.eager).tokens[0].tolist()
    assert drafts == draft.greedy_drafts(want, anchor)


def test_block_pass_equals_the_reference_draft(tiny_checkpoint, tiny_draft, references):
    llm = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_num_seqs=4,
              speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 4})
    recorder = TapRecorder(llm)
    prompt = list(range(50, 90))
    engine = llm.engine
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    engine.step()                                            # the prefill
    hidden = references[0].hidden_states(prompt)
    want = torch.cat([hidden[i] for i in (3, 4, 5, 6, 7)], dim=-1)
    assert (recorder.aux(40) - want).abs().max() <= 1e-4 * want.abs().max()
    item = engine.scheduler.schedule()[0]
    assert item.num_draft_tokens == 4
    check_block(llm, references, item, recorder)
    for step in engine.speculative.run([item]):
        for token in step.tokens:
            item.seq.append_token(token)
        engine.speculative.settle(step, len(step.tokens))
    engine.scheduler.complete([item])
    check_block(llm, references, engine.scheduler.schedule()[0], recorder)


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "neox"])
def test_rotary_embedding_equals_the_references(tmp_path, interleave):
    config_json = draft_preset_config("tiny-dspark")
    config_json["rope_interleave"] = interleave
    config_json["rope_parameters"].update(mscale=0.7, factor=8.0)
    (tmp_path / "config.json").write_text(__import__("json").dumps(config_json))
    config, reference = DraftConfig.from_pretrained(tmp_path), load_draft_config(tmp_path)
    positions = torch.tensor([0, 1, 17, 1023, 4095])
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(0))
    angle = positions.double()[:, None] * yarn_inverse_frequencies(config)[None, :]
    scale = yarn_mscale(8.0, 0.7) / yarn_mscale(8.0, 1.0)
    got = rotate(x, (angle.cos() * scale).float(), (angle.sin() * scale).float(), interleave)
    assert torch.allclose(got, apply_yarn_rope(x, positions, reference), atol=1e-6)
    # position 0 only scales; a pair keeps its norm times the scale
    assert torch.allclose(got[0], x[0] * scale, atol=1e-6)
