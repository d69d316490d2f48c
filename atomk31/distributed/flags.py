"""The parallel flags of `atomk31 serve` and `atomk31 generate`, spelled as vLLM's users type
them (each also in snake_case), and their values as EngineConfig fields."""

from __future__ import annotations

import argparse

from atomk31.config import EngineConfig

DEFAULTS = EngineConfig(model="")

PARALLEL_FIELDS = ("tensor_parallel_size", "enable_expert_parallel",
                   "decode_context_parallel_size", "token_sharded_prefill_min_tokens",
                   "distributed_timeout_s")


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "several GPUs", "one process per GPU; on one node the ranks are started by atomk31, "
        "across nodes run the same command under torchrun (README: Several GPUs)")
    group.add_argument("--tensor-parallel-size", "--tensor_parallel_size", "-tp",
                       dest="tensor_parallel_size", type=int, metavar="N",
                       default=DEFAULTS.tensor_parallel_size,
                       help="ranks (GPUs) the model is split over: MLA and KDA heads, dense "
                            "MLP and shared experts, LM head vocabulary")
    group.add_argument("--enable-expert-parallel", "--enable_expert_parallel",
                       dest="enable_expert_parallel", action="store_true",
                       default=DEFAULTS.enable_expert_parallel,
                       help="partition the routed experts over the ranks (E/N each) instead of "
                            "splitting every expert")
    group.add_argument("--decode-context-parallel-size", "--decode_context_parallel_size",
                       "-dcp", dest="decode_context_parallel_size", type=int, metavar="N",
                       default=DEFAULTS.decode_context_parallel_size,
                       help="shard each request's latent rows and index keys over groups of "
                            "this many ranks (a divisor of --tensor-parallel-size)")
    group.add_argument("--token-sharded-prefill-min-tokens",
                       "--token_sharded_prefill_min_tokens",
                       dest="token_sharded_prefill_min_tokens", type=int, metavar="TOKENS",
                       default=DEFAULTS.token_sharded_prefill_min_tokens,
                       help="prefill steps of at least this many tokens attend token-sharded "
                            "under TP (below: head-sharded)")
    group.add_argument("--distributed-timeout-s", "--distributed_timeout_s",
                       dest="distributed_timeout_s", type=float, metavar="SECONDS",
                       default=DEFAULTS.distributed_timeout_s,
                       help="longest wait of one collective before the engine fails")


def parallel_options(args: argparse.Namespace) -> dict:
    """The EngineConfig fields of the parallel flags."""
    return {name: getattr(args, name) for name in PARALLEL_FIELDS}
