"""The collectives one engine step issues, and the bytes each moves, from the model's shapes.

`step_collectives(config, layout, num_rows, ...)` lists every collective the model's forward
calls for a step of ``num_rows`` query rows (a decode batch, verification rows, or a prefill
chunk), per layer kind, with the payload one rank hands in: the tensor shapes are the ones
the layers build (``model/*``: one all-reduce per block output, the MoE's routed sum, the DCP
top-k's candidate scores and its LSE merge, token-sharded prefill's two all-to-alls, the LM
head's gather). The test (``tests/distributed/test_collective_bytes.py``) counts the bytes
the real layer code hands a counting communicator on the tiny model and checks them against
this list, so the full-model figures below are the code's own.

`bytes_sent_per_rank` turns a payload into what one rank sends with the usual algorithms:
ring all-reduce 2 (N-1)/N x payload, all-gather (N-1) x payload, all-to-all (N-1)/N x payload
(the buffer holds one part per rank, its own stays), gather to the first rank: payload.
Not counted: the step's broadcast (a few hundred bytes of token ids and block tables, pickled)
and the DCP top-k's positions exchange, one more all-gather of int64 [rows, k] in a layer
where a tie straddles the threshold (scores of exactly 0 from the indexer's ReLU do when a
row has fewer than k positive scores, in short contexts; at long contexts the threshold lies
above 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from atomk31.config import ModelConfig
from atomk31.distributed.layout import ParallelLayout

FP32 = 4


@dataclass(frozen=True)
class Collective:
    where: str           # which layer calls it
    kind: str            # "all_reduce" | "all_gather" | "all_to_all" | "gather_to_first"
    group: str           # "tp" (every rank) | "dcp" (the rank's DCP group)
    payload: int         # bytes one rank hands in per call
    calls: int           # calls per step (one per layer of the kind)


def step_collectives(config: ModelConfig, layout: ParallelLayout, num_rows: int,
                     num_sampled: int, compute_bytes: int = 2, is_sparse: bool = True,
                     token_sharded: bool = False) -> list[Collective]:
    """Every collective of one step (see the module docstring). ``is_sparse``: the step's
    MLA layers select (context beyond index_topk); ``token_sharded``: prefill attention
    token-sharded (TP without DCP)."""
    tp, dcp = layout.tp_size, layout.dcp_size
    d, mla, kda = config.hidden_size, len(config.mla_layer_ids), len(config.kda_layer_ids)
    moe = sum(config.is_moe_layer(layer) for layer in range(config.num_hidden_layers))
    dense = config.num_hidden_layers - moe
    block_output = num_rows * d * compute_bytes
    out: list[Collective] = []
    if tp == 1:
        return out
    out.append(Collective("KDA o_proj", "all_reduce", "tp", block_output, kda))
    out.append(Collective("MLA o_proj", "all_reduce", "tp", block_output, mla))
    if dense:
        out.append(Collective("dense MLP down_proj", "all_reduce", "tp", block_output, dense))
    if moe:
        latent = config.routed_expert_hidden_size or d
        out.append(Collective("MoE routed sum u (fp32)", "all_reduce", "tp",
                              num_rows * latent * FP32, moe))
        out.append(Collective("MoE output (shared + routed)", "all_reduce", "tp", block_output,
                              moe))
    heads = config.num_attention_heads
    if dcp > 1:
        attended = heads // layout.num_head_groups          # the head group's heads
        if is_sparse and config.has_indexer:
            out.append(Collective("DCP top-k candidate scores (fp32)", "all_gather", "dcp",
                                  num_rows * config.index_topk * FP32, mla))
        out.append(Collective("DCP LSE merge: partial outputs", "all_to_all", "dcp",
                              num_rows * attended * config.kv_lora_rank * compute_bytes, mla))
        out.append(Collective("DCP LSE merge: lse (fp32)", "all_to_all", "dcp",
                              num_rows * attended * FP32, mla))
    elif token_sharded:
        padded = -(-num_rows // tp) * tp
        share = heads // tp
        out.append(Collective("token-sharded prefill: queries", "all_to_all", "tp",
                              padded * share * config.latent_dim * compute_bytes, mla))
        out.append(Collective("token-sharded prefill: outputs", "all_to_all", "tp",
                              padded * share * config.kv_lora_rank * compute_bytes, mla))
    out.append(Collective("LM head logits (fp32)", "gather_to_first", "tp",
                          num_sampled * (config.vocab_size // tp) * FP32, 1))
    return out


def bytes_sent_per_rank(collective: Collective, group_size: int) -> float:
    """What one rank sends for one call (module docstring)."""
    n, payload = group_size, collective.payload
    return {"all_reduce": 2 * (n - 1) / n * payload, "all_gather": (n - 1) * payload,
            "all_to_all": (n - 1) / n * payload, "gather_to_first": payload}[collective.kind]


def step_bytes_sent(collectives: list[Collective], layout: ParallelLayout) -> float:
    """Bytes one rank sends in the whole step."""
    size = {"tp": layout.tp_size, "dcp": layout.dcp_size}
    return sum(c.calls * bytes_sent_per_rank(c, size[c.group]) for c in collectives)


PREFILL_CHUNK = 8192
# (heading, layout, rows per step, token-sharded prefill)
SCENARIOS = (
    ("decode row, TP8", ParallelLayout(8, 0, 1, True), 1, False),
    ("decode row, DCP8", ParallelLayout(8, 0, 8, True), 1, False),
    (f"{PREFILL_CHUNK // 1024}K prefill, TP8", ParallelLayout(8, 0, 1, True), PREFILL_CHUNK,
     False),
    (f"{PREFILL_CHUNK // 1024}K prefill, TP8 token-sharded", ParallelLayout(8, 0, 1, True),
     PREFILL_CHUNK, True),
    (f"{PREFILL_CHUNK // 1024}K prefill, DCP8", ParallelLayout(8, 0, 8, True), PREFILL_CHUNK,
     False),
)


def _size(num_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.1f} {unit}"
    return f"{num_bytes:,.0f} B" if num_bytes else "-"


def figures_table(config: ModelConfig) -> str:
    """Markdown: bytes one rank sends per step for each collective, in each SCENARIO (BF16
    activations, experts over EP8, one sampled row; a sparse step: context past index_topk)."""
    columns = []
    for _, layout, rows, token_sharded in SCENARIOS:
        collectives = step_collectives(config, layout, rows, 1, token_sharded=token_sharded)
        size = {"tp": layout.tp_size, "dcp": layout.dcp_size}
        columns.append({f"{c.where} ({c.kind}, {c.calls}x)":
                        c.calls * bytes_sent_per_rank(c, size[c.group]) for c in collectives})
        columns[-1]["all told"] = step_bytes_sent(collectives, layout)
    names = list(dict.fromkeys(name for column in columns for name in column))
    names.remove("all told")
    lines = ["| sent per rank per step | " + " | ".join(s[0] for s in SCENARIOS) + " |",
             "|---" * (len(SCENARIOS) + 1) + "|"]
    for name in names + ["all told"]:
        lines.append(f"| {name} | " + " | ".join(_size(c.get(name, 0)) for c in columns)
                     + " |")
    return "\n".join(lines)


def per_mla_layer_row_bytes(config: ModelConfig, layout: ParallelLayout) -> int:
    """Payload one rank hands in per query row and MLA layer under DCP: the candidate
    scores, the partial outputs and their lse, and the block's output all-reduce."""
    return sum(c.payload for c in step_collectives(config, layout, 1, 1)
               if c.where.startswith(("DCP", "MLA")))
