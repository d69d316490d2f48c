"""`atomk31 bench throughput`: offline throughput of the engine, in process, on a random
workload (vLLM's `benchmark_throughput` with its random dataset): `num_prompts` prompts of
input_len tokens (within ±range_ratio) that each generate output_len tokens (ignore_eos, so
every request runs to its length), all added at once and run to completion.

Reported: requests/s, output tokens/s and total (prompt + output) tokens/s over the wall time
from the first step to the last (the device synchronized at both ends). One short request runs
first, untimed, to compile the kernels.
"""

from __future__ import annotations

import time

import numpy as np

from atomk31.bench.ceilings import synchronize
from atomk31.bench.random_tokens import ordinary_token_ids, random_token_ids, sample_lengths
from atomk31.engine.llm_engine import LLMEngine
from atomk31.engine.sampling_params import SamplingParams

WARMUP_PROMPT_TOKENS = 16
WARMUP_OUTPUT_TOKENS = 2


def run_throughput(engine: LLMEngine, num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float, seed: int) -> dict:
    """Run the workload (module docstring); -> the figures of the result file."""
    rng = np.random.default_rng(seed)
    input_lens = sample_lengths(num_prompts, input_len, range_ratio, rng)
    output_lens = sample_lengths(num_prompts, output_len, range_ratio, rng)
    pool = ordinary_token_ids(engine.tokenizer)
    _run_to_completion(engine, [random_token_ids(pool, WARMUP_PROMPT_TOKENS, rng)],
                       [WARMUP_OUTPUT_TOKENS])
    prompts = [random_token_ids(pool, n, rng) for n in input_lens]
    seconds, num_generated = _run_to_completion(engine, prompts, output_lens)
    total_input = sum(input_lens)
    return {"num_prompts": num_prompts, "elapsed_time": seconds,
            "total_input_tokens": total_input, "total_output_tokens": num_generated,
            "requests_per_second": num_prompts / seconds,
            "output_tokens_per_second": num_generated / seconds,
            "tokens_per_second": (total_input + num_generated) / seconds,
            "input_lens": input_lens, "output_lens": output_lens}


def _run_to_completion(engine: LLMEngine, prompts: list[list[int]],
                       output_lens: list[int]) -> tuple[float, int]:
    """(wall seconds, tokens generated) of running every prompt to its output length."""
    for prompt, n in zip(prompts, output_lens):
        engine.add_request(prompt, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=n,
                                                  ignore_eos=True))
    num_generated = 0
    synchronize(engine.device)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                num_generated += sum(len(c.token_ids) for c in output.outputs)
    synchronize(engine.device)
    return time.perf_counter() - start, num_generated
