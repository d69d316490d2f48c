"""Check a checkpoint's tensor list against its config, and report every problem at once.

One pass over the names, shapes and dtypes that the shard headers give (nothing is loaded)
produces one CheckpointError listing all missing tensors, all unused ones, all shape or dtype
mismatches, and the tensors refused outright (FP8 indexer weights, MODEL_SPEC §3.2 / §6.5;
an expert matrix stored in both its MXFP4 and its dequantized form). Long lists are shown as
name patterns with counts, so a missing shard reads as a few lines, not thousands.
"""

from __future__ import annotations

import re

from atomk31.checkpoint.errors import CheckpointError
from atomk31.checkpoint.schema import (
    SKIPPED_PREFIXES,
    TensorSpec,
    dequantized_expert_tensors,
    expected_tensors,
    is_indexer_tensor,
    packed_names_of,
)
from atomk31.checkpoint.shards import DTYPE_NAMES, StoredTensor
from atomk31.config import ModelConfig

# Lists longer than this are summarised by name pattern.
MAX_LISTED = 20
_FP8_DTYPE_NAMES = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
_FP8_SCALE_SUFFIXES = ("weight_scale", "weight_scale_inv", "input_scale")


def check_tensors(config: ModelConfig, stored: dict[str, StoredTensor],
                  source: str = "checkpoint") -> dict[str, TensorSpec]:
    """The spec each loaded tensor was checked against, by name; raises CheckpointError.

    Vision tensors (`vision_tower.`, `mm_projector.`) are skipped, not counted as unused (§3).
    """
    specs = _select_forms(config, stored)
    reasons = {**_rejected_fp8_indexer(stored), **_experts_in_both_forms(config, stored)}
    missing = [name for name in specs if name not in stored]
    unused = [name for name in stored if name not in specs and name not in reasons
              and not name.startswith(SKIPPED_PREFIXES)]
    mismatched = [_mismatch(name, specs[name], stored[name]) for name in specs
                  if name in stored and name not in reasons
                  and not _matches(specs[name], stored[name])]
    rejected = [f"{name}: {reason}" for name, reason in reasons.items()]
    if missing or unused or mismatched or rejected:
        raise CheckpointError(_message(source, missing, unused, mismatched, rejected),
                              missing=missing, unused=unused, mismatched=mismatched,
                              rejected=rejected)
    return specs


def _select_forms(config: ModelConfig, stored: dict[str, StoredTensor]) -> dict[str, TensorSpec]:
    """expected_tensors, with each expert matrix stored dequantized switched to that form.

    A matrix is taken as dequantized when its `.weight` is present and neither of its packed
    tensors is; all other cases keep the MXFP4 form, so whatever is absent is reported missing.
    """
    specs = expected_tensors(config)
    for dense_name, dense_spec in dequantized_expert_tensors(config).items():
        if dense_name not in stored:
            continue
        packed, scale = packed_names_of(dense_name)
        if packed in stored or scale in stored:
            continue  # both forms: reported by _experts_in_both_forms
        del specs[packed], specs[scale]
        specs[dense_name] = dense_spec
    return specs


def _experts_in_both_forms(config: ModelConfig,
                           stored: dict[str, StoredTensor]) -> dict[str, str]:
    """name -> reason, for each expert matrix stored both dequantized and packed."""
    return {name: "stored both dequantized (.weight) and as MXFP4 (.weight_packed/"
                  ".weight_scale); keep one form per expert matrix"
            for name in dequantized_expert_tensors(config)
            if name in stored and any(n in stored for n in packed_names_of(name))}


def _rejected_fp8_indexer(stored: dict[str, StoredTensor]) -> dict[str, str]:
    """Indexer weights must stay BF16 (§3.2, §6.5, §8 #20): FP8 values or FP8 scales fail."""
    return {name: f"an FP8 indexer tensor ({tensor.dtype_name}); the indexer stays BF16 "
                  f"(MODEL_SPEC §3.2, §6.5): use a checkpoint with BF16 indexer weights"
            for name, tensor in stored.items()
            if is_indexer_tensor(name) and (tensor.dtype_name.upper() in _FP8_DTYPE_NAMES
                                            or name.endswith(_FP8_SCALE_SUFFIXES))}


def _matches(spec: TensorSpec, tensor: StoredTensor) -> bool:
    return spec.accepts_shape(tensor.shape) and spec.accepts_dtype(tensor.dtype)


def _describe_spec(spec: TensorSpec) -> str:
    dtypes = "|".join(DTYPE_NAMES.get(d, str(d)) for d in spec.dtypes)
    if spec.min_numel is not None:
        return f"any shape with >= {spec.min_numel} entries, dtype {dtypes}"
    return f"shape {list(spec.shape)}, dtype {dtypes}"


def _mismatch(name: str, spec: TensorSpec, tensor: StoredTensor) -> str:
    return (f"{name}: expected {_describe_spec(spec)}; found shape {list(tensor.shape)}, "
            f"dtype {tensor.dtype_name}")


def _message(source: str, missing: list[str], unused: list[str], mismatched: list[str],
             rejected: list[str]) -> str:
    total = len(missing) + len(unused) + len(mismatched) + len(rejected)
    parts = [f"{source} does not match its config.json ({total} problem(s)):"]
    sections = (("missing tensors", missing), ("unused tensors (not in the config)", unused),
                ("shape/dtype mismatches", mismatched), ("rejected tensors", rejected))
    for title, items in sections:
        if items:
            parts.append(f"  {title} ({len(items)}):")
            parts.extend(f"    {line}" for line in _summarise(items))
    if unused and all(not n.startswith("language_model.") for n in unused[:MAX_LISTED]):
        parts.append("  hint: text tensor names start with 'language_model.' (MODEL_SPEC §3); "
                     "a checkpoint without that prefix needs converting")
    parts.append("  fix: make config.json and the checkpoint agree (regenerate it with "
                 "`atomk31 make-checkpoint`, or use the config it was written for)")
    return "\n".join(parts)


def _summarise(items: list[str]) -> list[str]:
    """All lines if few; else one line per name pattern (layer/expert numbers as {l}/{e})."""
    if len(items) <= MAX_LISTED:
        return items
    groups: dict[str, list[str]] = {}
    for item in items:
        name = item.split(" ", 1)[0].rstrip(":")
        pattern = re.sub(r"experts\.\d+\.", "experts.{e}.", re.sub(r"layers\.\d+\.",
                                                                   "layers.{l}.", name))
        groups.setdefault(pattern, []).append(item)
    lines = [f"{pattern}: {len(members)} tensor(s), e.g. {members[0]}"
             for pattern, members in list(groups.items())[:MAX_LISTED]]
    if len(groups) > MAX_LISTED:
        rest = sum(len(m) for m in list(groups.values())[MAX_LISTED:])
        lines.append(f"... and {rest} more in {len(groups) - MAX_LISTED} more pattern(s)")
    return lines
