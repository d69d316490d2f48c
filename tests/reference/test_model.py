"""The whole tiny model (MODEL_SPEC §2.4): determinism, causality, sparsity, formats, trace, prefixes."""

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from atomk31.reference import ReferenceModel, attn_res, dense_mlp, kda_layer, rms_norm

TinyCheckpointWriter = Callable[..., Path]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).abs().max() / expected.abs().max())


def with_options(model: ReferenceModel, index_topk: int | None = None, **formats: str) -> ReferenceModel:
    config = model.config if index_topk is None else dataclasses.replace(model.config, index_topk=index_topk)
    options = {"index_key_format": "exact", "latent_format": "exact", "fp8_variant": "e4m3fn", **formats}
    return ReferenceModel(
        config, model.weights, options["index_key_format"], options["latent_format"], options["fp8_variant"]
    )


def test_forward_is_finite_and_bitwise_deterministic(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    logits = tiny_model.forward(tiny_prompt)
    assert logits.shape == (100, 1024) and logits.dtype == torch.float32
    assert bool(torch.isfinite(logits).all())
    assert torch.equal(tiny_model.forward(tiny_prompt), logits)


def test_forward_is_causal(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    full = tiny_model.forward(tiny_prompt)
    for t in (0, 40, 64, 99):
        prefix_logits = tiny_model.forward(tiny_prompt[: t + 1])
        assert relative_error(prefix_logits[t], full[t]) < 1e-5, t


def test_prompt_longer_than_index_topk_is_sparse(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    dense = with_options(tiny_model, index_topk=10**9)
    sparse_logits, dense_logits = tiny_model.forward(tiny_prompt), dense.forward(tiny_prompt)
    # p + 1 <= 64: every causal key is selected. Not bitwise: MoE expert batches differ in size.
    assert relative_error(sparse_logits[:64], dense_logits[:64]) < 1e-5
    assert relative_error(sparse_logits[64:], dense_logits[64:]) > 1e-3


def test_prompt_within_index_topk_equals_dense(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    dense = with_options(tiny_model, index_topk=10**9)
    assert torch.equal(tiny_model.forward(tiny_prompt[:64]), dense.forward(tiny_prompt[:64]))


def test_greedy_extends_the_prompt_by_argmax(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    prompt = tiny_prompt[:10].tolist()
    tokens = tiny_model.greedy(prompt, 3)
    assert len(tokens) == 3 and all(0 <= t < 1024 for t in tokens)
    assert tokens[0] == int(tiny_model.forward(torch.tensor(prompt)).argmax(-1)[-1])
    assert tokens[2] == int(tiny_model.forward(torch.tensor(prompt + tokens[:2])).argmax(-1)[-1])
    assert tiny_model.greedy(torch.tensor(prompt), 3) == tokens
    assert tiny_model.greedy(prompt, 0) == []


@pytest.mark.parametrize(
    "formats",
    [
        {"index_key_format": "fp8"},
        {"index_key_format": "mxfp4"},
        {"latent_format": "fp8"},
        {"index_key_format": "fp8", "latent_format": "fp8", "fp8_variant": "e4m3fnuz"},
    ],
    ids=["fp8_keys", "mxfp4_keys", "fp8_latent", "fnuz_keys_and_latent"],
)
def test_simulated_cache_formats_change_logits_slightly(
    tiny_model: ReferenceModel, tiny_prompt: torch.Tensor, formats: dict[str, str]
) -> None:
    """Random tiny models are chaotic (MoE routing and top-k flips, §9 #2): most rows barely move, a few move a lot."""
    exact = tiny_model.forward(tiny_prompt)
    simulated = with_options(tiny_model, **formats).forward(tiny_prompt)
    row_errors = (simulated - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert 0.0 < float((simulated - exact).norm() / exact.norm()) < 0.3
    assert float(row_errors.median()) < 0.05
    assert float((simulated.argmax(-1) == exact.argmax(-1)).float().mean()) >= 0.8


@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
def test_index_key_format_does_not_matter_while_every_key_is_selected(
    tiny_model: ReferenceModel, tiny_prompt: torch.Tensor, key_format: str
) -> None:
    """Index keys only steer the selection: within index_topk tokens the logits are bitwise equal."""
    simulated = with_options(tiny_model, index_key_format=key_format)
    assert torch.equal(simulated.forward(tiny_prompt[:64]), tiny_model.forward(tiny_prompt[:64]))


def test_trace_shows_activations_of_order_one(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    trace: list[dict] = []
    tiny_model.forward(tiny_prompt, trace=trace)
    assert [entry["layer"] for entry in trace] == list(range(8))
    assert [entry["kind"] for entry in trace] == ["kda", "kda", "kda", "mla", "kda", "kda", "kda", "mla"]
    for entry in trace:
        for key in ("mixer_out_rms", "ffn_out_rms", "prefix_rms"):
            assert 0.05 < entry[key] < 10.0, (entry["layer"], key, entry[key])


def test_layer_zero_banks_the_embedding(tiny_model: ReferenceModel, tiny_prompt: torch.Tensor) -> None:
    """§4.3: layer 0 mixes only the embedding, banks it, and its prefix restarts from the mixer output."""
    prefixes = tiny_model.hidden_states(tiny_prompt[:12])
    assert len(prefixes) == 8 and all(p.shape == (12, 256) for p in prefixes)
    weights, eps = tiny_model.weights, tiny_model.config.rms_norm_eps
    layer = weights.layers[0]
    embedding = weights.embed_tokens[tiny_prompt[:12]]
    mixer_output, _ = kda_layer(rms_norm(embedding, layer.input_layernorm, eps), layer.kda, -5.0, eps)
    x = attn_res([embedding], mixer_output, layer.mlp_res_proj, layer.mlp_res_norm, layer.post_attention_layernorm, eps)
    expected = mixer_output + dense_mlp(x, layer.mlp, 4.0, 25.0)
    torch.testing.assert_close(prefixes[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, overrides, removed",
    [
        ("plain_k3", {}, ("index_topk",)),
        ("no_attn_res", {"attn_res_block_size": None}, ()),
        (
            "no_latent",
            {"routed_expert_hidden_size": None, "activation_situ_beta": None, "activation_situ_linear_beta": None},
            (),
        ),
    ],
    ids=["plain_k3_dense_mla", "no_attn_res", "no_latent_null_betas"],
)
def test_config_variants_load_and_run(
    make_tiny_checkpoint: TinyCheckpointWriter, tiny_prompt: torch.Tensor, name: str, overrides: dict, removed: tuple
) -> None:
    model = ReferenceModel.from_pretrained(make_tiny_checkpoint(name, overrides, removed))
    assert bool(torch.isfinite(model.forward(tiny_prompt[:70])).all())


def test_empty_sequence_gives_empty_logits(tiny_model: ReferenceModel) -> None:
    assert tiny_model.forward(torch.zeros(0, dtype=torch.long)).shape == (0, 1024)


def test_bad_inputs_and_options_are_rejected(tiny_model: ReferenceModel, tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 1024\), got min 0, max 1024"):
        tiny_model.forward(torch.tensor([0, 1024]))
    with pytest.raises(ValueError, match="1-D integer sequence"):
        tiny_model.forward(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty prompt"):
        tiny_model.greedy([], 1)
    with pytest.raises(ValueError, match="index_key_format must be one of"):
        ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="nvfp4")
