"""atomk31/bench/roofline.py against hand counts on the tiny config (MODEL_SPEC §2.4) and against
the bytes of the engine's own tensors.

Tiny: V 1024, D 256, 8 layers (MLA at 3 and 7, KDA elsewhere), MLA 4 heads (q_lora 256,
kv_lora 512, nope 128, rope 64, v 128, gated), indexer 4 x 128 with top-k 64, KDA 4 heads of
128 (conv 4), dense layer 0 of width 512, MoE layers 1..7 with 16 experts (top 4, latent 128,
width 128, 2 shared), AttnRes on.
"""

from __future__ import annotations

import pytest
import torch

from atomk31.bench.latency import storage_format
from atomk31.bench.roofline import (
    StorageFormat, decode_step_bytes, is_sparse_step, prefill_flops, weight_bytes,
)
from atomk31.checkpoint.presets import preset_config
from atomk31.config import ModelConfig
from atomk31.engine.llm_engine import LLMEngine

PTPC = {"global_quant_config": "ptpc_fp8"}


@pytest.fixture(scope="module")
def tiny() -> ModelConfig:
    return ModelConfig.from_dict(preset_config("tiny"))


# Hand count, BF16 compute: per tensor rows x cols x bytes (fp32 where model/ keeps fp32).
SITE_NORMS = 4 * 256 * 4                  # two AttnRes queries + two out norms, fp32 [256]
KDA_LAYER = (3 * 512 * 256 * 2 + 512 * 256 * 2 + 3 * 512 * 4 * 4 + 128 * 256 * 2
             + 512 * 128 * 2 + 4 * 256 * 2 + 4 * 4 + 512 * 4 + 128 * 4 + 256 * 512 * 2)
MLA_LAYER = (256 * 256 * 2 + 256 * 2 + 768 * 256 * 2 + 576 * 256 * 2 + 512 * 2
             + 1024 * 512 * 2 + 512 * 256 * 2 + 256 * 512 * 2 + 128 * 256 * 2 + 2 * 128 * 2)
INDEX_QUERY_LAYER = 512 * 256 * 2 + 4 * 256 * 2        # wq_b, weights_proj
DENSE_MLP = 3 * 512 * 256 * 2
MOE_LAYER = (16 * 256 * 4 + 16 * 4 + 2 * 128 * 256 * 2 + 128 * 4 + 3 * 256 * 256 * 2)
EXPERT = 3 * (128 * 64 + 128 * 4)                      # w1, w3, w2: E2M1 bytes + E8M0 bytes
GLOBAL = 256 * 4 + 256 * 4 + 1024 * 256 * 2            # final norm, output AttnRes, lm_head


def test_weight_bytes_equal_a_hand_count_bf16(tiny):
    w = weight_bytes(tiny, StorageFormat(compute_dtype=torch.bfloat16))
    assert w.embedding_row == 256 * 2
    assert w.expert == EXPERT
    assert w.num_moe_layers == 7
    assert w.index_query == 2 * INDEX_QUERY_LAYER
    assert w.always == (GLOBAL + 8 * SITE_NORMS + 6 * KDA_LAYER + 2 * MLA_LAYER + DENSE_MLP
                        + 7 * MOE_LAYER)
    assert w.total == w.always + w.index_query + 1024 * 256 * 2 + 7 * 16 * EXPERT


def test_ptpc_stores_eligible_linears_as_fp8_with_row_scales(tiny):
    bf16 = weight_bytes(tiny, StorageFormat(compute_dtype=torch.bfloat16))
    fp8 = weight_bytes(tiny, StorageFormat(compute_dtype=torch.bfloat16, online_quant_config=PTPC))
    # MODEL_SPEC §6.5: KDA q|k|v, g, f_a, f_b, o; MLA q_a, q_b, kv_a, g, o (kv_b is dequantized
    # at load); shared experts; the dense MLP. Each halves, plus 4 B per output row.
    def saving(rows: int, cols: int) -> int:
        return rows * cols * 2 - (rows * cols + rows * 4)

    kda = 3 * saving(512, 256) + saving(512, 256) + saving(128, 256) + saving(512, 128) \
        + saving(256, 512)
    mla = saving(256, 256) + saving(768, 256) + saving(576, 256) + saving(512, 256) \
        + saving(256, 512)
    moe = 2 * saving(256, 256) + saving(256, 256)
    dense = 2 * saving(512, 256) + saving(256, 512)
    assert bf16.always - fp8.always == 6 * kda + 2 * mla + 7 * moe + dense
    assert fp8.index_query == bf16.index_query and fp8.expert == bf16.expert


@pytest.mark.parametrize("online_quant_config", [None, PTPC], ids=["as-stored", "ptpc"])
def test_weight_bytes_equal_the_engines_own_tensors(engine_options, online_quant_config):
    engine = LLMEngine(engine_options(kv_cache_memory=64 << 20,
                                      online_quant_config=online_quant_config))
    assert weight_bytes(engine.model_config, storage_format(engine)).total == \
        _stored_tensor_bytes(engine.model)


def test_dense_decode_step_reads_weights_experts_latent_rows_and_states(tiny):
    fmt = StorageFormat(compute_dtype=torch.bfloat16)
    w = weight_bytes(tiny, fmt)
    step = decode_step_bytes(tiny, fmt, [40, 10], num_distinct_experts=20)
    assert not is_sparse_step(tiny, [40, 10])
    assert step.weights == w.always + 2 * 512
    assert step.experts == 20 * EXPERT
    # per MLA layer: 50 fp8 latent rows of 576 read, 2 new rows (576 + index key 132) written
    assert step.kv == 2 * (50 * 576 + 2 * (576 + 132))
    # read + write of 6 layers x (fp32 [4, 128, 128] + bf16 conv [3, 3, 512]), per request
    assert step.kda_state == 2 * 2 * 6 * (4 * 128 * 128 * 4 + 3 * 3 * 512 * 2)


def test_sparse_decode_step_reads_index_keys_and_top_k_latent_rows(tiny):
    fmt = StorageFormat(compute_dtype=torch.bfloat16, index_format="mxfp4")
    w = weight_bytes(tiny, fmt)
    step = decode_step_bytes(tiny, fmt, [200, 30], num_distinct_experts=0)
    assert is_sparse_step(tiny, [200, 30])
    assert step.weights == w.always + w.index_query + 2 * 512
    # MXFP4 keys: 64 + 4 B; the long request reads its 200 keys and 64 rows, the short one 30
    assert step.kv == 2 * (200 * 68 + 64 * 576 + 30 * 68 + 30 * 576 + 2 * (576 + 68))


def test_prefill_flops_equal_a_hand_count(tiny):
    t = 100
    mla_macs = (256 * 256 + 256 * 768 + 256 * 576 + 4 * 128 * 512 + 4 * 512 * 128
                + 2 * 256 * 512 + 256 * 128)
    kda_macs = 256 * 1536 + 256 * 128 + 128 * 512 + 256 * 4 + 256 * 512 + 512 * 256
    moe_macs = 256 * 16 + 2 * 256 * 128 + 4 * 3 * 128 * 128 + 3 * 256 * 256
    flops = prefill_flops(tiny, t)
    assert flops.projections == 2 * t * (2 * mla_macs + 6 * kda_macs + 3 * 256 * 512)
    assert flops.moe == 2 * t * 7 * moe_macs
    assert flops.kda == 6 * t * 6 * 4 * 128 * 128
    keys = 64 * 65 // 2 + (t - 64) * 64           # min(p + 1, 64) summed over p < 100
    assert flops.attention == 2 * 2 * 4 * (576 + 512) * keys
    scored = sum(p + 1 for p in range(64, t))      # rows p >= 64 score their p + 1 keys
    assert flops.indexer == 2 * (2 * (t - 64) * (256 * 512 + 256 * 4) + 2 * 512 * scored)
    assert flops.lm_head == 2 * 256 * 1024
    assert flops.total == (flops.projections + flops.moe + flops.kda + flops.attention
                           + flops.indexer + flops.lm_head)


def test_prefill_within_top_k_runs_no_indexer_and_attends_every_causal_key(tiny):
    flops = prefill_flops(tiny, 64)
    assert flops.indexer == 0
    assert flops.attention == 2 * 2 * 4 * (576 + 512) * (64 * 65 // 2)


def _stored_tensor_bytes(model: object) -> int:
    """Bytes of every distinct tensor storage reachable from the engine's model object."""
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack = [model]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("atomk31.model"):
            stack.extend(vars(obj).values())
    return sum(storages.values())
