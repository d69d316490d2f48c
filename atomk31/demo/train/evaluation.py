"""The trainer's own accuracy check: teacher-forced exact match on held-out instances.

An instance counts as solved when the model's argmax at every completion position is the
reference token. With the reference prefix fed in, that is exactly the condition for greedy
decoding to reproduce the reference turn token for token, so it is a lower bound of what the
server will score (which only checks the answer) and costs one forward pass. It runs the way
the shipped model runs: MLA through the indexer's top-k, routed experts at their MXFP4 values.
The instances come from the eval split with their own seed (EVAL_SEED), apart from the ones
`atomk31 eval` draws by default (seed 0).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from atomk31.checkpoint import Tokenizer
from atomk31.demo.tasks import generate
from atomk31.demo.train.data import IGNORE, EncodedExample, collate, encode
from atomk31.demo.train.model import DemoModel, ForwardOptions

EVAL_SEED = 1


def build_eval_set(tokenizer: Tokenizer, per_family: int, passkey_lengths: tuple[int, ...],
                   per_length: int) -> dict[str, list[EncodedExample]]:
    """Held-out instances: `per_family` of arithmetic, tools and chat, `per_length` passkey
    instances at each length; keys "arithmetic", ..., "passkey@1024", ..."""
    sets = {family: [encode(generate(family, "eval", EVAL_SEED, i), tokenizer)
                     for i in range(per_family)] for family in ("arithmetic", "tools", "chat")}
    for length in passkey_lengths:
        sets[f"passkey@{length}"] = [
            encode(generate("passkey", "eval", EVAL_SEED, i, num_tokens=length), tokenizer)
            for i in range(per_length)]
    return sets


@contextmanager
def shipped_precision(model: DemoModel):
    """Eval mode with the routed experts at their MXFP4 values and FP8 latents; restores the
    previous state."""
    was_training = model.training
    modules = [*model.moe_layers(), *model.mla_layers()]
    flags = [module.quantize for module in modules]
    model.eval()
    model.set_quantized(True)
    try:
        yield
    finally:
        for module, flag in zip(modules, flags):
            module.quantize = flag
        model.train(was_training)


@torch.no_grad()
def exact_match(model: DemoModel, examples: list[EncodedExample], pad_id: int,
                device: torch.device, max_batch_tokens: int, autocast: bool) -> float:
    """Share of `examples` whose whole completion is the argmax under teacher forcing."""
    import random

    solved = 0
    longest = max(len(e.ids) for e in examples)
    per_batch = max(1, max_batch_tokens // longest)
    for start in range(0, len(examples), per_batch):
        batch = collate(examples[start:start + per_batch], pad_id, random.Random(0)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            hidden, _ = model(batch.input_ids, ForwardOptions(sparse=True))
        supervised = batch.targets != IGNORE
        predictions = model.logits(hidden).argmax(dim=-1)
        wrong = (predictions != batch.targets) & supervised
        solved += int((~wrong.any(dim=-1)).sum())
    return solved / len(examples)


def evaluate(model: DemoModel, eval_set: dict[str, list[EncodedExample]], pad_id: int,
             device: torch.device, max_batch_tokens: int, autocast: bool) -> dict[str, float]:
    """Exact match per key of `eval_set`, plus "score": the mean over arithmetic, tools, chat
    and passkey (itself the mean over its lengths)."""
    with shipped_precision(model):
        accuracy = {name: exact_match(model, examples, pad_id, device, max_batch_tokens, autocast)
                    for name, examples in eval_set.items()}
    passkey = [v for k, v in accuracy.items() if k.startswith("passkey@")]
    families = [accuracy[k] for k in ("arithmetic", "tools", "chat") if k in accuracy]
    if passkey:
        families.append(sum(passkey) / len(passkey))
    accuracy["score"] = sum(families) / len(families) if families else math.nan
    return accuracy
