"""Random weights for generated checkpoints: what to draw for each tensor, and drawing it.

`plan_parameters(config)` turns `schema.expected_tensors(config)` into an ordered list of
`PlannedParameter`s (names, shapes, dtypes, init rule) without touching any data, so a writer
can size and shard a 23 GB checkpoint before drawing a number, and a test can compare the plan
with the schema. `draw(parameter, generator)` then materialises one parameter.

Scaling (so that activations stay of order one through every layer, which makes greedy
comparisons between implementations meaningful; the per-layer RMS is checked by
tests/checkpoint/test_activation_scale.py):
* every linear `[out, in]`, the experts included: N(0, 1/in), so `x @ W.T` keeps RMS 1 for
  RMS-1 inputs. This also sets the AttnRes pseudo-queries `*_res_proj` ([1, D]): a score
  `w_p . rms_norm(v)` then has std ~1 across candidates, so the depth softmax (§4.3) is neither
  uniform nor saturated; the router logits get std ~1 (sigmoid scores well spread); and the
  indexer's scores vary over positions by about as much as their mean, so top-k selection is
  not decided by rounding noise (§4.6);
* embeddings: N(0, 1); norm weights (RMSNorm and LayerNorm): 1 + N(0, 0.02^2); LayerNorm bias
  and the router's `e_score_correction_bias`: N(0, 0.02^2) (small: they only nudge);
* KDA short-conv weights `[C, 1, Kc]`: N(0, 1/Kc) (the same fan-in rule);
* KDA `A_log = log(U(1, 16))` and `dt_bias ~ U(-4, 0)`: with the forget gate
  `g = lb * sigmoid(exp(A_log) * (f + dt_bias))` (§4.4, lb = -5, f of RMS 1) the per-step decay
  `exp(g)` then ranges from ~0.01 (forget at once) to ~1 (remember hundreds of tokens) across
  heads and channels, so the recurrence and its state precision are both exercised.
* the latent MoE's `routed_expert_up_proj`: N(0, (0.1)^2/in), a tenth of the fan-in rule.
  A random router puts many tokens near a tie between their 4th and 5th expert, so BF16-level
  noise swaps an expert for a few percent of tokens per layer; at full gain each swap moved a
  token's hidden state by ~50% and the KDA states carried it to every later token, so that
  BF16 and float32 runs disagreed on the top-1 token even where its margin was large (§9 #2).
  At a tenth, a swap is a small step, the routed experts still change every logit far above
  the 1e-4 tolerance of the float32 comparisons, and teacher-forced BF16 checks mean something.
Routed experts are drawn in float32 and quantized with `quantize_mxfp4` (§3.3, §6.3).
Draws are float32 and cast to the stored dtype (BF16, or F32 for the "f32|bf16" vectors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from atomk31.checkpoint.schema import TensorSpec, expected_tensors
from atomk31.config import ModelConfig
from atomk31.quant import quantize_mxfp4

# Large tensors are drawn in row chunks of at most this many elements (bounded fp32 scratch);
# the chunking depends only on the shape, so draws stay deterministic.
MAX_DRAW_ELEMENTS = 1 << 24
NORM_WEIGHT_NOISE = 0.02
SMALL_BIAS_STD = 0.02
A_LOG_RATE_RANGE = (1.0, 16.0)
DT_BIAS_RANGE = (-4.0, 0.0)
ROUTED_OUTPUT_GAIN = 0.1


@dataclass(frozen=True)
class InitRule:
    """One distribution: `normal` (mean, std), `uniform` (low, high) or `log_uniform`
    (the log of a uniform draw on [low, high])."""

    kind: str
    mean: float = 0.0
    std: float = 1.0
    low: float = 0.0
    high: float = 1.0


@dataclass(frozen=True)
class PlannedParameter:
    """One random draw and the tensors it becomes: one tensor, or an MXFP4 expert matrix's
    (`weight_packed`, `weight_scale`) pair drawn as one logical `[out, in]` matrix."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    draw_shape: tuple[int, ...]
    rule: InitRule
    is_mxfp4: bool = False

    @property
    def nbytes(self) -> int:
        return sum(math.prod(shape) * dtype.itemsize
                   for shape, dtype in zip(self.shapes, self.dtypes))


def plan_parameters(config: ModelConfig) -> list[PlannedParameter]:
    """Every parameter of a checkpoint for `config`, in schema (writing) order; no data."""
    specs = expected_tensors(config)
    plan = []
    for name, spec in specs.items():
        if name.endswith(".weight_scale"):
            continue  # drawn with its .weight_packed partner
        if name.endswith(".weight_packed"):
            scale_name = name[: -len("_packed")] + "_scale"
            scale = specs[scale_name]
            rows, packed_cols = spec.shape
            plan.append(PlannedParameter(
                names=(name, scale_name), shapes=(spec.shape, scale.shape),
                dtypes=(torch.uint8, torch.uint8), draw_shape=(rows, 2 * packed_cols),
                rule=InitRule("normal", std=(2 * packed_cols) ** -0.5), is_mxfp4=True))
            continue
        # "f32|bf16" vectors list F32 first: the writer stores them F32.
        plan.append(PlannedParameter(names=(name,), shapes=(spec.shape,),
                                     dtypes=(spec.dtypes[0],), draw_shape=spec.shape,
                                     rule=init_rule(name, spec)))
    return plan


def init_rule(name: str, spec: TensorSpec) -> InitRule:
    """The distribution of one (non-expert) tensor; see the module docstring for why."""
    if name.endswith("embed_tokens.weight"):
        return InitRule("normal", std=1.0)
    if name.endswith(".A_log"):
        return InitRule("log_uniform", low=A_LOG_RATE_RANGE[0], high=A_LOG_RATE_RANGE[1])
    if name.endswith(".dt_bias"):
        return InitRule("uniform", low=DT_BIAS_RANGE[0], high=DT_BIAS_RANGE[1])
    if name.endswith("norm.weight"):  # every RMSNorm / LayerNorm weight
        return InitRule("normal", mean=1.0, std=NORM_WEIGHT_NOISE)
    if name.endswith(("norm.bias", "e_score_correction_bias")):
        return InitRule("normal", std=SMALL_BIAS_STD)
    if name.endswith("routed_expert_up_proj.weight"):
        return InitRule("normal", std=ROUTED_OUTPUT_GAIN * spec.shape[-1] ** -0.5)
    if len(spec.shape) >= 2:  # linears [out, in] and convs [C, 1, Kc]: fan-in = last dim
        return InitRule("normal", std=spec.shape[-1] ** -0.5)
    raise ValueError(f"no init rule for {name} of shape {list(spec.shape)}; add one to "
                     f"atomk31/checkpoint/random_init.py")


def draw(parameter: PlannedParameter, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Materialise one planned parameter: name -> tensor in its stored dtype, on the
    generator's device (a CUDA generator draws a real-width checkpoint in seconds; the values
    then differ from a CPU draw of the same seed)."""
    if parameter.is_mxfp4:
        logical = _draw_float32(parameter.draw_shape, parameter.rule, generator)
        packed, scales = quantize_mxfp4(logical)
        return dict(zip(parameter.names, (packed, scales)))
    (name,), (dtype,) = parameter.names, parameter.dtypes
    shape = parameter.draw_shape
    out = torch.empty(shape, dtype=dtype, device=generator.device)
    rows, row_numel = shape[0], math.prod(shape[1:])
    rows_per_chunk = max(1, MAX_DRAW_ELEMENTS // row_numel)
    flat = out.view(rows, row_numel)
    for start in range(0, rows, rows_per_chunk):
        stop = min(rows, start + rows_per_chunk)
        flat[start:stop] = _draw_float32((stop - start, row_numel), parameter.rule, generator)
    return {name: out}


def _draw_float32(shape: tuple[int, ...], rule: InitRule,
                  generator: torch.Generator) -> torch.Tensor:
    device = generator.device
    if rule.kind == "normal":
        return torch.randn(shape, generator=generator, device=device) * rule.std + rule.mean
    uniform = torch.rand(shape, generator=generator, device=device) * (rule.high - rule.low) \
        + rule.low
    if rule.kind == "uniform":
        return uniform
    if rule.kind == "log_uniform":
        return torch.log(uniform)
    raise ValueError(f"unknown init rule kind {rule.kind!r}; expected normal, uniform or "
                     f"log_uniform")
