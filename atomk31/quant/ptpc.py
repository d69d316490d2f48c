"""PTPC-FP8 online quantizer: BF16 linears to FP8 with one scale per output channel, at load
(MODEL_SPEC §6.5).

For an eligible linear ``W [out, in]``: ``s_w[o] = max(amax_i |W[o, i]|, 1e-12) / fmax``,
``W_q = fp8(clamp(W / s_w[:, None], -fmax, fmax))`` (RNE, saturating). Activations get their
per-token scales at run time (``ops/linear.py``: ``ptpc_linear``).

The config has ATOM's ``--online_quant_config`` shape [ATOM:recipes/Kimi-K3.md]::

    {"global_quant_config": "ptpc_fp8",
     "exclude_layer": ["lm_head", "model.embed_tokens", "*self_attn.[qkv]_conv1d*", ...]}

An exclude entry is matched against the module name (the tensor name without ``.weight``),
with and without the checkpoint's ``language_model.`` prefix, as ATOM matches it: ``re:``
entries are regular expressions (``re.search``); entries with ``*`` or ``?`` are fnmatch
globs matching the module or a module under it; other entries match exactly or as a
prefix ending at a dot (``"lm_head"`` excludes ``lm_head``).

Whatever the config says, §6.5's list always stays BF16: lm_head, embed_tokens, the
short-conv weights, routed experts and ``routed_expert_{down,up}_proj``, the router
``gate``, ``b_proj``, ``*_res_proj``, the whole ``indexer`` (DEFINED HERE in §6.5), norms and
every tensor that is not a 2-D floating ``*.weight``.
DEFINED HERE: the 1e-12 floor on the weight amax (an all-zero row gets a tiny scale and zero
codes, not NaN), mirroring the activation floor of §6.5.
"""

import fnmatch
import re
from dataclasses import dataclass

import torch

from atomk31.quant.fp8 import FP8_VARIANTS, divide_exactly, fp8_dtype, fp8_max

PTPC_SCHEME = "ptpc_fp8"
MIN_WEIGHT_AMAX = 1e-12
SCALE_SUFFIX = "weight_scale"

# §6.5: linears that stay BF16 whatever the config says (regular expressions on module names).
ALWAYS_EXCLUDED: tuple[str, ...] = (
    r"(^|\.)lm_head$",
    r"(^|\.)embed_tokens$",
    r"_conv1d$",
    r"\.experts(\.|$)",
    r"\.routed_expert_(down|up)_proj$",
    r"\.block_sparse_moe\.gate$",
    r"\.b_proj$",
    r"_res_proj$",
    r"\.indexer(\.|$)",
    r"norm$",
)


@dataclass(frozen=True)
class OnlineQuantConfig:
    """Parsed ``--online-quant-config``: the scheme and the user's exclude entries."""

    scheme: str
    exclude: tuple[str, ...]


def parse_online_quant_config(config: dict) -> OnlineQuantConfig:
    """Validate ATOM's JSON shape; ``ValueError`` lists what is wrong and what is expected."""
    if not isinstance(config, dict):
        raise ValueError(f"online quant config must be a JSON object like "
                         f'{{"global_quant_config": "{PTPC_SCHEME}", "exclude_layer": [...]}}, '
                         f"got {type(config).__name__}")
    unknown = sorted(set(config) - {"global_quant_config", "exclude_layer"})
    if unknown:
        raise ValueError(f"online quant config: unknown keys {unknown}; expected "
                         "global_quant_config and optionally exclude_layer")
    scheme = config.get("global_quant_config")
    if scheme != PTPC_SCHEME:
        raise ValueError(f"online quant config: global_quant_config must be {PTPC_SCHEME!r} "
                         f"(the only online scheme atomk31 implements), got {scheme!r}")
    exclude = config.get("exclude_layer", [])
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ValueError(f"online quant config: exclude_layer must be a list of strings "
                         f"(names, fnmatch globs or 're:' regexes), got {exclude!r}")
    return OnlineQuantConfig(scheme, tuple(exclude))


def matches_exclude(module: str, entry: str) -> bool:
    """ATOM's exclude matching of one entry against one module name."""
    if entry.startswith("re:"):
        return re.search(entry[3:], module) is not None
    if "*" in entry or "?" in entry:
        return fnmatch.fnmatch(module, entry) or fnmatch.fnmatch(module, entry + ".*")
    return module == entry or module.startswith(entry + ".")


def is_ptpc_eligible(name: str, tensor: torch.Tensor, config: OnlineQuantConfig) -> bool:
    """Whether the checkpoint tensor ``name`` is a linear weight that PTPC quantizes."""
    if not name.endswith(".weight") or tensor.dim() != 2 or not tensor.is_floating_point() \
            or tensor.element_size() < 2:
        return False
    module = name[: -len(".weight")]
    if any(re.search(pattern, module) for pattern in ALWAYS_EXCLUDED):
        return False
    short = module.removeprefix("language_model.")
    return not any(matches_exclude(m, entry) for entry in config.exclude for m in {module, short})


def quantize_weight_ptpc(
    weight: torch.Tensor, variant: str = "e4m3fn"
) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] (any float dtype) -> (w_fp8 [out, in], w_scale fp32 [out])."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_weight_ptpc: weight must be [out, in], got "
                         f"{tuple(weight.shape)}")
    if variant not in FP8_VARIANTS:
        raise ValueError(f"quantize_weight_ptpc: variant must be one of {FP8_VARIANTS}, got "
                         f"{variant!r}")
    fmax = fp8_max(variant)
    w = weight.float()
    scale = divide_exactly(w.abs().amax(dim=1).clamp_min(MIN_WEIGHT_AMAX), fmax)
    return (w / scale[:, None]).clamp(-fmax, fmax).to(fp8_dtype(variant)), scale


def quantize_linears_ptpc(
    weights: dict[str, torch.Tensor], config: dict, variant: str = "e4m3fn"
) -> dict[str, torch.Tensor]:
    """A new weight dict in which every eligible ``X.weight`` is FP8 and ``X.weight_scale``
    (fp32 [out]) is added; every other tensor is passed through unchanged.

    ``config`` is the parsed ``--online-quant-config`` JSON (ATOM's shape); quantization runs
    on each weight's own device, one matrix at a time.
    """
    parsed = parse_online_quant_config(config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if is_ptpc_eligible(name, tensor, parsed):
            w_fp8, w_scale = quantize_weight_ptpc(tensor, variant)
            out[name] = w_fp8
            out[name[: -len("weight")] + SCALE_SUFFIX] = w_scale
        else:
            out[name] = tensor
    return out
