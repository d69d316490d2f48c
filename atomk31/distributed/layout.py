"""Where one rank sits among the ranks of a distributed engine, and what share of the model
it holds.

One process per device; ``tensor_parallel_size`` (TP) ranks in all. Rank ``t``:

* **TP** splits, by rank order, the MLA heads' output side (``W_uv``, ``g_proj``, ``o_proj``),
  the KDA heads, the dense MLP's and shared experts' intermediate channels, the LM head's
  vocabulary, and (without expert parallelism) each routed expert's intermediate channels.
* **EP** (``enable_expert_parallel``) partitions the routed experts instead: rank ``t`` holds
  experts ``[t E/TP, (t+1) E/TP)`` whole.
* **DCP** of size ``W`` (a divisor of TP, vLLM's rule) groups consecutive ranks:
  ``dcp_rank = t % W``, head group ``t // W``. The ranks of one DCP group hold disjoint token
  shards of every request's latent rows and index keys (round-robin by token,
  ``model/dcp_attention.py``) and attend the same heads (their head group's ``H W / TP``
  heads: the query projection is replicated across the group), so each computes every
  head's partial attention over its own tokens; the partials are merged by log-sum-exp into
  each rank's TP heads. Without DCP (W = 1) the head group of a rank is its TP heads.

The indexer, router, latent projections, norms and embeddings are replicated.
`parallel_problems` lists the model sizes that cannot be split this way.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomk31.config import ConfigError, ModelConfig

MXFP4_GROUP = 32   # an MXFP4 scale covers 32 inputs (§3.3): a split must not cut a group


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part ``index`` of ``n`` items cut into ``parts`` equal parts."""
    if n % parts:
        raise ValueError(f"cannot split {n} into {parts} equal parts")
    size = n // parts
    return index * size, (index + 1) * size


@dataclass(frozen=True)
class ParallelLayout:
    """One rank's position (see the module docstring); the default is a single device."""

    tp_size: int = 1
    tp_rank: int = 0
    dcp_size: int = 1
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.tp_rank < self.tp_size or self.tp_size % self.dcp_size:
            raise ValueError(f"rank {self.tp_rank} of {self.tp_size} with DCP {self.dcp_size}: "
                             "the rank must be in range and DCP must divide TP")

    @property
    def is_distributed(self) -> bool:
        return self.tp_size > 1

    @property
    def dcp_rank(self) -> int:
        return self.tp_rank % self.dcp_size

    @property
    def head_group(self) -> int:
        """Which head group this rank attends for (ranks of one DCP group share it)."""
        return self.tp_rank // self.dcp_size

    @property
    def num_head_groups(self) -> int:
        return self.tp_size // self.dcp_size

    def dcp_group_ranks(self, head_group: int | None = None) -> list[int]:
        """The ranks of one DCP group (default: this rank's), in DCP-rank order."""
        g = self.head_group if head_group is None else head_group
        return list(range(g * self.dcp_size, (g + 1) * self.dcp_size))

    def tp_range(self, n: int) -> tuple[int, int]:
        """This rank's TP share of ``n`` (heads, channels, vocabulary rows)."""
        return split_range(n, self.tp_size, self.tp_rank)

    def attention_head_range(self, num_heads: int) -> tuple[int, int]:
        """The MLA heads whose queries and partial attention this rank computes: its head
        group's (= its TP heads without DCP)."""
        return split_range(num_heads, self.num_head_groups, self.head_group)

    def expert_range(self, num_experts: int) -> tuple[int, int]:
        """The routed experts this rank holds: its EP share, or all of them."""
        if not self.expert_parallel:
            return 0, num_experts
        return split_range(num_experts, self.tp_size, self.tp_rank)

    def expert_channel_range(self, intermediate: int) -> tuple[int, int]:
        """The intermediate channels of each routed expert held here: all under EP, else
        this rank's TP share."""
        if self.expert_parallel:
            return 0, intermediate
        return self.tp_range(intermediate)


def parallel_problems(config: ModelConfig, tp: int, dcp: int, expert_parallel: bool) -> list[str]:
    """Every model size that ``tp`` ranks (with ``dcp`` and ``expert_parallel``) cannot split."""
    problems = []

    def must_divide(what: str, n: int, why: str = "") -> None:
        if n % tp:
            problems.append(f"{what} ({n}) must be divisible by tensor_parallel_size ({tp})"
                            + (f": {why}" if why else ""))

    must_divide("num_attention_heads", config.num_attention_heads)
    must_divide("linear_attn_config.num_heads", config.kda_num_heads, "the KDA heads are split")
    must_divide("vocab_size", config.vocab_size, "the LM head is split by vocabulary")
    must_divide("intermediate_size", config.intermediate_size, "the dense MLP is split")
    if config.num_shared_experts:
        must_divide("moe_intermediate_size x num_shared_experts",
                    config.moe_intermediate_size * config.num_shared_experts,
                    "the shared experts are split")
    if expert_parallel:
        must_divide("num_experts", config.num_experts,
                    "expert parallelism partitions the routed experts")
    elif config.moe_intermediate_size % (tp * MXFP4_GROUP):
        problems.append(
            f"moe_intermediate_size ({config.moe_intermediate_size}) split over "
            f"tensor_parallel_size ({tp}) must leave a multiple of {MXFP4_GROUP} channels per "
            "rank (an MXFP4 scale group); pass --enable-expert-parallel to keep experts whole")
    if tp % dcp == 0 and config.num_attention_heads % (tp // dcp):
        problems.append(f"num_attention_heads ({config.num_attention_heads}) must be divisible "
                        f"by the number of head groups, tensor_parallel_size / "
                        f"decode_context_parallel_size ({tp // dcp})")
    return problems


def check_parallel(config: ModelConfig, tp: int, dcp: int, expert_parallel: bool) -> None:
    """Raise ConfigError listing every problem of `parallel_problems`."""
    problems = parallel_problems(config, tp, dcp, expert_parallel)
    if problems:
        raise ConfigError(problems, source="parallel options")
