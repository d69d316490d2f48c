"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from atomk31.config import EngineConfig
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.outputs import RequestOutput
from atomk31.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def _built_in_model() -> Path:
    """The shipped demo checkpoint; while the package ships none, the random tiny checkpoint
    (seed 0, the same weights `atomk31 serve` falls back to), written to a temporary directory."""
    from atomk31.checkpoint import make_checkpoint
    from atomk31.demo.shipped import shipped_checkpoint

    shipped = shipped_checkpoint()
    if shipped is not None:
        return shipped
    logger.warning("the package ships no trained demo weights yet; LLM() serves the random tiny "
                   "checkpoint")
    return make_checkpoint("tiny", seed=0, out=tempfile.mkdtemp(prefix="atomk31-tiny-"),
                           progress=False)


class LLM:
    """An engine for offline batches.

    Arguments are EngineConfig's (see its docstring): `model` is a checkpoint directory (None:
    the built-in model, as `atomk31 serve` with no `--model`); `dtype="auto"` means float32
    compute and cache on CPU, BF16 compute and an FP8 cache on GPU.
    `speculative_config`: DSpark speculative decoding, e.g. `{"model": DRAFT_DIR,
    "num_speculative_tokens": 5}` (atomk31/speculative_config.py).
    With ``tensor_parallel_size=N`` it starts N-1 more ranks on this node (one process per
    device) and stops them at `shutdown()` (or on leaving a ``with`` block).
    """

    def __init__(self, model: str | os.PathLike | None = None, *, block_size: int = 128,
                 kernel_backend: str = "auto", dtype: str = "auto",
                 max_model_len: int | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 4096, enable_prefix_caching: bool = True,
                 kv_cache_dtype: str = "auto", index_cache_dtype: str = "fp8",
                 device: str | None = None, gpu_memory_utilization: float = 0.9,
                 kv_cache_memory: int | None = None, snapshot_fraction: float = 0.1,
                 kda_snapshot_interval: int = 2048,
                 online_quant_config: dict | None = None, seed: int = 0,
                 enforce_eager: bool = False, speculative_config: dict | None = None,
                 tensor_parallel_size: int = 1,
                 enable_expert_parallel: bool = False, decode_context_parallel_size: int = 1,
                 token_sharded_prefill_min_tokens: int = 16384,
                 distributed_timeout_s: float = 600.0, dequantize_experts: str = "auto"):
        if model is None:
            model = _built_in_model()
        options = EngineConfig(
            model=str(model), block_size=block_size, kernel_backend=kernel_backend, dtype=dtype,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_prefix_caching=enable_prefix_caching, kv_cache_dtype=kv_cache_dtype,
            index_cache_dtype=index_cache_dtype, device=device,
            gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory=kv_cache_memory,
            snapshot_fraction=snapshot_fraction, kda_snapshot_interval=kda_snapshot_interval,
            online_quant_config=online_quant_config,
            seed=seed, enforce_eager=enforce_eager, speculative_config=speculative_config,
            tensor_parallel_size=tensor_parallel_size,
            enable_expert_parallel=enable_expert_parallel,
            decode_context_parallel_size=decode_context_parallel_size,
            token_sharded_prefill_min_tokens=token_sharded_prefill_min_tokens,
            distributed_timeout_s=distributed_timeout_s, dequantize_experts=dequantize_experts)
        self.engine = LLMEngine(options)

    def shutdown(self) -> None:
        """Stop the ranks this LLM started (tensor_parallel_size > 1); nothing otherwise."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: list[str] | list[list[int]] | str,
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of the prompts."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params; "
                             "pass one SamplingParams or one per prompt")
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), disable=not use_tqdm, desc="generate") as bar:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        return [results[i] for i in ids]
