"""What the trainer computes is what the shipped checkpoint computes: the trainer's forward
(sparse MLA through the indexer, MXFP4 experts) equals the float32 reference on the exported
weights, and the export follows the checkpoint schema."""

import pytest
import torch

from atomk31.checkpoint import expected_tensors
from atomk31.config import ModelConfig
from atomk31.demo.model_config import demo_config
from atomk31.demo.train.export import checkpoint_tensors, read_checkpoint, write_checkpoint
from atomk31.demo.train.model import DemoModel, ForwardOptions
from atomk31.reference import ReferenceModel


def _bf16_exact_toy_model() -> tuple[DemoModel, dict]:
    """A toy model whose weights survive the BF16 export exactly, with AttnRes and router
    biases away from their zero init so every path counts."""
    torch.manual_seed(0)
    config_json = demo_config("toy")
    model = DemoModel(ModelConfig.from_dict(config_json))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("res_proj.weight"):
                parameter.normal_(std=0.3)
            parameter.copy_(parameter.to(torch.bfloat16).float())
        for moe in model.moe_layers():
            moe.gate.e_score_correction_bias.normal_(std=0.01)
    return model.eval(), config_json


@pytest.mark.parametrize("fp8_latent", [False, True])
def test_trainer_forward_equals_the_reference_on_the_exported_checkpoint(tmp_path, fp8_latent,
                                                                        demo_tokenizer_dir):
    """Selection over FP8 index keys always (the engine's default); the FP8 latent cache when
    the trainer simulates it (quantization-aware training)."""
    model, config_json = _bf16_exact_toy_model()
    model.set_quantized(True)
    for mla in model.mla_layers():
        mla.quantize = fp8_latent
    out = write_checkpoint(model, config_json, demo_tokenizer_dir, tmp_path / "checkpoint")
    reference = ReferenceModel.from_pretrained(out, index_key_format="fp8",
                                               latent_format="fp8" if fp8_latent else "exact")
    ids = torch.randint(0, 1800, (90,), generator=torch.Generator().manual_seed(1))
    assert ids.numel() > model.config.index_topk          # the indexer's selection is exercised
    with torch.no_grad():
        hidden, _ = model(ids[None], ForwardOptions(sparse=True))
        trained = model.logits(hidden)[0]
    expected = reference.forward(ids)
    assert (trained - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_export_names_and_dtypes_follow_the_schema():
    model, _ = _bf16_exact_toy_model()
    tensors = checkpoint_tensors(model)
    specs = expected_tensors(model.config)
    assert set(tensors) == set(specs)
    for name, tensor in tensors.items():
        assert specs[name].accepts_dtype(tensor.dtype), name
        assert specs[name].accepts_shape(tuple(tensor.shape)), name
    assert tensors["language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_packed"].dtype \
        == torch.uint8


def test_a_written_checkpoint_reads_back_into_the_trainer(tmp_path, demo_tokenizer_dir):
    model, config_json = _bf16_exact_toy_model()
    out = write_checkpoint(model, config_json, demo_tokenizer_dir, tmp_path / "checkpoint")
    again = DemoModel(ModelConfig.from_dict(config_json))
    read_checkpoint(again, out)
    assert checkpoint_tensors(again).keys() == checkpoint_tensors(model).keys()
    for name, tensor in checkpoint_tensors(again).items():
        assert torch.equal(tensor, checkpoint_tensors(model)[name]), name


def test_reading_a_checkpoint_of_another_config_is_refused(tmp_path, demo_tokenizer_dir):
    model, config_json = _bf16_exact_toy_model()
    out = write_checkpoint(model, config_json, demo_tokenizer_dir, tmp_path / "checkpoint")
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight has shape \[2048, 128\], "
                                         r"the model's is \[2048, 256\]; the checkpoint was "
                                         r"written for another config"):
        read_checkpoint(DemoModel(ModelConfig.from_dict(demo_config("demo"))), out)
