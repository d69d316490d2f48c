"""Configuration: the model's `config.json` (ModelConfig), validated once.

`ModelConfig.from_pretrained(path)` reads a K3 / K3.1 `config.json` as MODEL_SPEC.md §2 defines
it (root + `text_config`, or a flat text config; `quantization_config` at either level, the text
level winning) and checks it. Every problem is collected and reported at once, each under the key
that caused it, so one run shows everything wrong with a config.

Decisions where MODEL_SPEC.md is silent (also listed in the closing note of issue 2):
- Unknown keys are errors, except HuggingFace bookkeeping keys (`IGNORED_*_KEYS`) that carry no
  model meaning. A misspelled field therefore cannot silently fall back to a default.
- `index_key_norm` (optional, DEFINED HERE): the indexer's key normalisation; only LayerNorm
  (`"layernorm"`, the default) is supported, §4.6.
- `index_layers` (optional, DEFINED HERE): 1-based list of indexer (DSA) layers; when present it
  must equal `linear_attn_config.full_attn_layers` (every MLA layer has its own indexer, §1).
- An FP8 `quantization_config` that does not exclude the indexer is rejected: indexer weights
  stay BF16 (§3.2, §6.5 / §8 #20). The checkpoint loader also rejects FP8 indexer tensors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomk31.config_checks import (  # noqa: F401 (ConfigError: part of this module's API)
    IGNORED_TEXT_KEYS, ConfigError, LINEAR_ATTN_FIELDS, TEXT_FIELDS, check_fields, check_semantics,
    split_text_config,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelConfig:
    """The text model of K3 / K3.1 (MODEL_SPEC.md §2.2), validated. Layer ids are 0-based."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    max_position_embeddings: int
    rms_norm_eps: float
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    mla_use_output_gate: bool
    mla_layer_ids: tuple[int, ...]
    kda_layer_ids: tuple[int, ...]
    kda_num_heads: int
    kda_head_dim: int
    short_conv_kernel_size: int
    gate_lower_bound: float | None
    intermediate_size: int
    activation_situ_beta: float
    activation_situ_linear_beta: float | None
    num_experts: int
    num_experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int
    routed_expert_hidden_size: int | None
    latent_moe_use_norm: bool
    moe_renormalize: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    attn_res_block_size: int | None
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    quantization_config: dict | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- derived -------------------------------------------------------------------------
    @property
    def has_indexer(self) -> bool:
        """K3.1 (DSA on every MLA layer) vs plain K3 (dense MLA), §2.1 / §9 #13."""
        return self.index_topk is not None

    @property
    def latent_dim(self) -> int:
        """Width of one cached MLA row: c (kv_lora_rank) ‖ k_r (qk_rope_head_dim) = 576."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_mla_layer(self, layer: int) -> bool:
        return layer in self.mla_layer_ids

    def dequantized_expert_bytes(self, itemsize: int, ranks: int = 1) -> int:
        """Bytes of one rank's routed experts (w1, w2, w3) at ``itemsize`` bytes a weight."""
        per_expert = 3 * self.moe_intermediate_size * (self.routed_expert_hidden_size
                                                       or self.hidden_size) * itemsize
        moe_layers = sum(map(self.is_moe_layer, range(self.num_hidden_layers)))
        return -(-moe_layers * self.num_experts * per_expert // ranks)

    def is_moe_layer(self, layer: int) -> bool:
        """§1: MoE iff l >= first_k_dense_replace and l % moe_layer_freq == 0."""
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def closes_attn_res_block(self, layer: int) -> bool:
        """§4.3: a depth block is banked at the attention site of layers l % bs == 0."""
        return bool(self.attn_res_block_size) and layer % self.attn_res_block_size == 0

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read `<path>/config.json` (or `path` itself if it is a file) and validate it."""
        p = Path(path)
        file = p / "config.json" if p.is_dir() else p
        if not file.is_file():
            raise FileNotFoundError(f"no config.json at {file}; pass the checkpoint directory")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError([f"not valid JSON: {e}"], source=str(file)) from e
        return cls.from_dict(data, source=str(file))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        problems: list[str] = []
        text = split_text_config(data, problems)
        values = check_fields(text, TEXT_FIELDS, IGNORED_TEXT_KEYS, "", problems)
        lin = text.get("linear_attn_config")
        lin_values = (check_fields(lin, LINEAR_ATTN_FIELDS, frozenset(), "linear_attn_config.",
                                    problems) if isinstance(lin, dict) else {})
        check_semantics(values, lin_values, problems)
        if problems:
            raise ConfigError(problems, source)
        n = values["num_hidden_layers"]
        mla = tuple(sorted(i - 1 for i in lin_values["full_attn_layers"]))
        kda = tuple(sorted(i - 1 for i in lin_values["kda_layers"]))
        expected_mla = tuple(i - 1 for i in range(1, n + 1) if i % 4 == 0 or i == n)
        if mla != expected_mla:
            logger.warning("full_attn_layers %s break K3's rule (every fourth layer plus the "
                           "last); following the config's lists (MODEL_SPEC §1)",
                           [i + 1 for i in mla])
        beta = values.get("activation_situ_beta")
        return cls(
            vocab_size=values["vocab_size"], hidden_size=values["hidden_size"],
            num_hidden_layers=n, max_position_embeddings=values["max_position_embeddings"],
            rms_norm_eps=float(values["rms_norm_eps"]),
            num_attention_heads=values["num_attention_heads"],
            q_lora_rank=values["q_lora_rank"], kv_lora_rank=values["kv_lora_rank"],
            qk_nope_head_dim=values["qk_nope_head_dim"],
            qk_rope_head_dim=values["qk_rope_head_dim"], v_head_dim=values["v_head_dim"],
            mla_use_output_gate=values["mla_use_output_gate"],
            mla_layer_ids=mla, kda_layer_ids=kda,
            kda_num_heads=lin_values["num_heads"], kda_head_dim=lin_values["head_dim"],
            short_conv_kernel_size=lin_values["short_conv_kernel_size"],
            gate_lower_bound=_float_or_none(lin_values["gate_lower_bound"]),
            intermediate_size=values["intermediate_size"],
            activation_situ_beta=1.0 if beta is None else float(beta),  # §9 #14
            activation_situ_linear_beta=_float_or_none(values.get("activation_situ_linear_beta")),
            num_experts=values["num_experts"],
            num_experts_per_token=values["num_experts_per_token"],
            num_shared_experts=values["num_shared_experts"],
            moe_intermediate_size=values["moe_intermediate_size"],
            routed_expert_hidden_size=values["routed_expert_hidden_size"],
            latent_moe_use_norm=values["latent_moe_use_norm"],
            moe_renormalize=values["moe_renormalize"],
            routed_scaling_factor=float(values["routed_scaling_factor"]),
            first_k_dense_replace=values["first_k_dense_replace"],
            moe_layer_freq=values["moe_layer_freq"],
            attn_res_block_size=values["attn_res_block_size"],
            index_n_heads=values.get("index_n_heads"), index_head_dim=values.get("index_head_dim"),
            index_topk=values.get("index_topk"),
            quantization_config=values.get("quantization_config"),
            raw=data,
        )

    def to_dict(self) -> dict:
        """The config.json this config was read from."""
        return json.loads(json.dumps(self.raw))

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _float_or_none(v: float | int | None) -> float | None:
    return None if v is None else float(v)




KERNEL_BACKENDS = ("auto", "torch", "triton", "hopper", "amd")
DTYPES = ("auto", "bfloat16", "float32")
KV_CACHE_DTYPES = ("auto", "fp8", "bf16", "fp32")
INDEX_CACHE_DTYPES = ("fp8", "mxfp4")
DEQUANTIZE_EXPERTS = ("auto", "on", "off")
# "auto" dequantizes MXFP4 experts at load on CPU up to this many bytes of dequantized experts
# per rank (a 2-core machine's demo model needs 12 MB; the proxy at real widths would need
# far more than a CPU host holds, and keeps its MXFP4 bytes)
CPU_DEQUANTIZED_EXPERTS_MAX_BYTES = 2 << 30


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model: the flags of `atomk31 serve` / the arguments of `LLM(...)`.

    `resolve(device)` turns the "auto" choices into concrete ones once, at start-up:
    - dtype "auto": float32 on CPU (so the engine reproduces the float32 oracle), bfloat16 on GPU.
    - kv_cache_dtype "auto": the compute dtype on CPU (float32), fp8 on GPU (§7.1).
    - the FP8 variant: e4m3fnuz on gfx942 (MI300), e4m3fn elsewhere (§6.1).
    - max_model_len None: the checkpoint's max_position_embeddings.
    - dequantize_experts "auto": on with torch kernels on CPU when the dequantized experts fit
      in CPU_DEQUANTIZED_EXPERTS_MAX_BYTES, else off (see the field).
    """

    model: str
    block_size: int = 128
    kernel_backend: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    index_cache_dtype: str = "fp8"
    device: str | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None  # bytes for the block pool + KDA states; overrides utilization
    snapshot_fraction: float = 0.1      # share of the cache budget kept for KDA prefix snapshots
    # KDA prefix snapshots (a full K3.1 state is 449 MB) are taken at the end of every
    # prompt's last full block and every this many tokens (a multiple of block_size; 0: at
    # prompt ends only), not at every block (engine/scheduler.py)
    kda_snapshot_interval: int = 2048
    max_num_waiting: int = 1024         # beyond this the server answers 503
    seed: int = 0
    # decode steps run eagerly, never from CUDA graphs (engine/cuda_graphs.py): for debugging
    # and profiling a step's kernels one by one
    enforce_eager: bool = False
    # PTPC-FP8 online quantization of BF16 linears at load (§6.5), ATOM's JSON shape:
    # {"global_quant_config": "ptpc_fp8", "exclude_layer": [...]}; None = weights as stored
    online_quant_config: dict | None = None
    # DSpark speculative decoding (speculative_config.py): {"model": DIR | "builtin",
    # "num_speculative_tokens": N, "method": "dspark", "draft_sample_method": ...}; None = off
    speculative_config: dict | None = None
    # Several devices (atomk31/distributed/): ranks = tensor_parallel_size, one per device.
    # TP splits the MLA and KDA heads, the dense MLP and shared experts, and the LM head's
    # vocabulary; expert parallelism partitions the routed experts over the same ranks instead
    # of splitting each expert; DCP (a divisor of TP, vLLM's rule) shards each request's
    # latent rows and index keys over groups of that many ranks.
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    decode_context_parallel_size: int = 1
    # prefill steps of at least this many tokens run MLA attention token-sharded under TP
    # (atomk31/model/mla_sharding.py); shorter ones head-sharded
    token_sharded_prefill_min_tokens: int = 16384
    distributed_timeout_s: float = 600.0   # longest wait of one collective before it fails
    # MXFP4 routed experts dequantized once at load into the compute dtype ("on"), or kept as
    # stored ("off"). The torch expert op has no MXFP4 matmul: it decodes each chosen expert at
    # every call, most of a CPU decode step and several times more in a verify step. The
    # decode is exact in BF16 and fp32 (E2M1 x 2^k, one mantissa bit), so both give the same
    # tokens. "auto": on for torch kernels on CPU within CPU_DEQUANTIZED_EXPERTS_MAX_BYTES.
    dequantize_experts: str = "auto"

    def __post_init__(self) -> None:
        problems: list[str] = []
        problems += parallel_option_problems(self)
        bs = self.block_size
        if not isinstance(bs, int) or bs < 1 or bs & (bs - 1):
            problems.append(f"block_size must be a power of two, got {bs}; pass --block-size 64 "
                            "or 128")
        for name, value, choices in (
            ("kernel_backend", self.kernel_backend, KERNEL_BACKENDS), ("dtype", self.dtype, DTYPES),
            ("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES),
            ("index_cache_dtype", self.index_cache_dtype, INDEX_CACHE_DTYPES),
            ("dequantize_experts", self.dequantize_experts, DEQUANTIZE_EXPERTS),
        ):
            if value not in choices:
                problems.append(f"{name} must be one of {', '.join(choices)}, got {value!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_num_waiting"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 1:
            problems.append(f"max_model_len must be >= 1, got {self.max_model_len}")
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append("gpu_memory_utilization must be in (0, 1], got "
                            f"{self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            problems.append(f"kv_cache_memory must be a positive byte count, got {self.kv_cache_memory}")
        if not 0 <= self.snapshot_fraction < 1:
            problems.append(f"snapshot_fraction must be in [0, 1), got {self.snapshot_fraction}")
        interval = self.kda_snapshot_interval
        block_size_valid = isinstance(bs, int) and bs >= 1 and not bs & (bs - 1)
        if interval < 0 or (block_size_valid and interval % bs):
            problems.append(f"kda_snapshot_interval must be 0 or a positive multiple of "
                            f"block_size ({self.block_size}), got {interval}")
        if self.online_quant_config is not None:
            from atomk31.quant.ptpc import parse_online_quant_config

            try:
                parse_online_quant_config(self.online_quant_config)
            except ValueError as e:
                problems.append(f"online_quant_config: {e}")
        if self.speculative_config is not None:
            from atomk31.speculative_config import speculative_option_problems

            problems.extend(speculative_option_problems(self.speculative_config))
        if problems:
            raise ConfigError(problems, source="engine options")

    def resolve(self, model_config: ModelConfig, device: "torch.device") -> "ResolvedEngineConfig":
        import torch

        on_cpu = device.type == "cpu"
        compute = {"auto": torch.float32 if on_cpu else torch.bfloat16,
                   "bfloat16": torch.bfloat16, "float32": torch.float32}[self.dtype]
        is_gfx942 = (device.type == "cuda" and torch.version.hip is not None
                     and "gfx942" in torch.cuda.get_device_properties(device).gcnArchName)
        fp8_variant = "e4m3fnuz" if is_gfx942 else "e4m3fn"
        fp8 = torch.float8_e4m3fnuz if is_gfx942 else torch.float8_e4m3fn
        kv = self.kv_cache_dtype
        latent = {"auto": compute if on_cpu else fp8, "fp8": fp8, "bf16": torch.bfloat16,
                  "fp32": torch.float32}[kv]
        index = self.index_cache_dtype
        if index == "mxfp4" and is_gfx942:
            logger.warning("MXFP4 index keys need gfx950; gfx942 falls back to FP8 (MODEL_SPEC §8 #9)")
            index = "fp8"
        limit = model_config.max_position_embeddings
        max_len = self.max_model_len or limit
        if max_len > limit:
            raise ConfigError([f"max_model_len {max_len} exceeds the model's "
                               f"max_position_embeddings {limit}"], source="engine options")
        speculative = None
        if self.speculative_config is not None:
            from atomk31.speculative_config import resolve_speculative_config

            speculative = resolve_speculative_config(self.speculative_config, model_config,
                                                     max_len)
        return ResolvedEngineConfig(self, device, compute, latent, index, fp8_variant, max_len,
                                    speculative, self._dequantizes_experts(model_config, on_cpu,
                                                                           compute))

    def _dequantizes_experts(self, model_config: ModelConfig, on_cpu: bool,
                             compute: "torch.dtype") -> bool:
        if self.dequantize_experts != "auto":
            return self.dequantize_experts == "on"
        if not on_cpu or self.kernel_backend not in ("auto", "torch"):
            return False
        return model_config.dequantized_expert_bytes(compute.itemsize,
                                                     self.tensor_parallel_size) \
            <= CPU_DEQUANTIZED_EXPERTS_MAX_BYTES


def parallel_option_problems(options: "EngineConfig") -> list[str]:
    """The parallel flags on their own (the model's sizes are checked against them by
    atomk31.distributed.layout.parallel_problems)."""
    problems = []
    tp, dcp = options.tensor_parallel_size, options.decode_context_parallel_size
    if not isinstance(tp, int) or tp < 1:
        problems.append(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
    elif not isinstance(dcp, int) or dcp < 1 or tp % dcp:
        problems.append(f"decode_context_parallel_size must divide tensor_parallel_size ({tp}): "
                        f"DCP groups are made of TP ranks; got {dcp!r}; pass e.g. "
                        f"--decode-context-parallel-size {tp}")
    if options.token_sharded_prefill_min_tokens < 1:
        problems.append("token_sharded_prefill_min_tokens must be >= 1, got "
                        f"{options.token_sharded_prefill_min_tokens}")
    if not options.distributed_timeout_s > 0:
        problems.append(f"distributed_timeout_s must be > 0, got {options.distributed_timeout_s}")
    if options.speculative_config is not None and tp != 1:
        problems.append("speculative decoding (speculative_config) runs on one device for now: "
                        f"tensor_parallel_size must be 1, got {tp}; drop one of the two")
    return problems


@dataclass(frozen=True)
class TorchrunRank:
    """The rank torchrun started this process as (its environment variables, read here once)."""

    rank: int
    world_size: int
    local_rank: int


def torchrun_rank() -> TorchrunRank | None:
    """This process's torchrun rank, or None outside torchrun (no RANK / WORLD_SIZE set).
    torch.distributed's ``env://`` rendezvous reads MASTER_ADDR / MASTER_PORT itself."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return TorchrunRank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                        int(os.environ.get("LOCAL_RANK", "0")))


@dataclass(frozen=True)
class ResolvedEngineConfig:
    """EngineConfig with every "auto" decided for one device (see EngineConfig.resolve)."""

    options: EngineConfig
    device: "torch.device"
    compute_dtype: "torch.dtype"
    latent_cache_dtype: "torch.dtype"
    index_cache_format: str
    fp8_variant: str
    max_model_len: int
    speculative: "SpeculativeConfig | None" = None   # speculative_config.py
    dequantize_experts: bool = False    # EngineConfig.dequantize_experts, decided
