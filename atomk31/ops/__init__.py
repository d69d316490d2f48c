"""The ops layer: one module per op (contract, torch implementation, registry entries).

Importing this package imports every op module, so each registers its implementations; the
engine then calls ``select_kernels(backend, context)`` once at start-up (DESIGN.md §3) and
gets the eager and the graph table.
"""

from atomk31.ops import (  # noqa: F401  (imported for their registrations)
    activation, attn_res, dense_mla, indexer_score, kda, kda_conv, kda_prefill, kv_write, linear,
    moe, norms, sparse_mla, topk,
)
from atomk31.ops.op_table import Kernels, OpTable
from atomk31.ops.registry import (
    BACKEND_CHOICES, TARGETS, define_op, register, registered_ops, select_kernels,
)
from atomk31.ops.target import KernelContext, Target

__all__ = ["BACKEND_CHOICES", "TARGETS", "KernelContext", "Kernels", "OpTable", "Target",
           "define_op", "register", "registered_ops", "select_kernels"]
