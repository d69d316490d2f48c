"""The ops layer: one module per op (contract, torch implementation, registry entries).

Importing this package imports every op module, so each registers its implementations; the
engine then calls ``select_ops(backend, device)`` once at startup (DESIGN.md §3).
"""

from atomk31.ops import (  # noqa: F401  (imported for their registrations)
    activation, attn_res, dense_mla, indexer_score, kda, kda_conv, kda_prefill, kv_write, linear,
    moe, norms, sparse_mla, topk,
)
from atomk31.ops import amd_backend  # noqa: F401,E402  (the amd registrations, after the others)
from atomk31.ops.registry import BACKENDS, OpTable, register, registered_ops, select_ops

__all__ = ["BACKENDS", "OpTable", "register", "registered_ops", "select_ops"]
