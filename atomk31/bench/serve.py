"""`atomk31 bench serve`: load an OpenAI-compatible server with random prompts and report what
`vllm bench serve` reports (serve_metrics.py), as a table and, with --result-file, as JSON.

Prompts. Every prompt has exactly its sampled number of tokens (--input-len within
±--range-ratio, vLLM's random dataset): on /v1/completions they are sent as token ids, which
OpenAI-compatible completions endpoints (ours, vLLM's, SGLang's) accept; on
/v1/chat/completions (or with --prompt-format text) as text that the tokenizer encodes to
exactly that many tokens (random_tokens.py: words of one token each). The chat template then
adds its own tokens, which the server's usage counts: the result's input_lens are the server's
counts. The tokenizer is read from --tokenizer, else from the
served model id when it is a local checkpoint directory, else, for the built-in checkpoint's
name, from the built-in checkpoint.

Arrivals: all at once with --request-rate inf (the default), else a Poisson process of that
rate; --max-concurrency bounds the requests in flight (the wait is the result's queue_times).
Each request has a --request-timeout deadline, so a stuck server ends the run with failures
instead of a hang; failures are counted and their errors printed (grouped) and kept in the JSON.

Warm-ups: --num-warmups requests (other random prompts of the same lengths, so that the timed
ones get no prefix-cache hit from them) run first at the same concurrency and are not counted:
a server that compiles or captures CUDA graphs on a shape's first step (ours does) would
otherwise put those seconds into the first requests' TTFT.

A speculative server's acceptance over the run comes from its /metrics (serve_spec.py): the
result's ``spec_decode`` (None without speculation counters) and a section of the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from tqdm.auto import tqdm

from atomk31.bench.errors import BenchmarkError
from atomk31.bench.random_tokens import (
    ordinary_token_ids, random_text, random_token_ids, sample_lengths, word_token_ids,
)
from atomk31.bench.serve_client import (
    CHAT, RequestResult, RequestSpec, endpoint_kind, request_body, send_request,
)
from atomk31.bench.serve_metrics import compute_metrics, format_report
from atomk31.bench.serve_spec import format_spec_decode, read_spec_counters, spec_decode_figures
from atomk31.checkpoint import Tokenizer

logger = logging.getLogger(__name__)

MODELS_TIMEOUT_S = 30.0
WARMUP_SEED_OFFSET = 1_000_003     # the warm-up prompts' seed: --seed + this
MAX_ERRORS_SHOWN = 10


class ServeBenchError(BenchmarkError):
    """The benchmark cannot start (server unreachable, no model, no tokenizer)."""


@dataclass(frozen=True)
class ServeOptions:
    base_url: str
    endpoint: str
    model: str | None
    tokenizer: Path | None
    input_len: int
    output_len: int
    num_prompts: int
    range_ratio: float
    seed: int
    max_concurrency: int | None
    request_rate: float
    ignore_eos: bool
    temperature: float | None
    prompt_format: str | None          # "token-ids" | "text" | None: by endpoint
    request_timeout: float
    api_key: str | None
    disable_tqdm: bool
    num_warmups: int = 0               # requests sent first and not counted (module docstring)


def auth_headers(options: ServeOptions) -> dict[str, str]:
    return {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}


async def first_model(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> str:
    """The id of the first model the server lists at /v1/models."""
    url = f"{base_url}/v1/models"
    try:
        response = await client.get(url, headers=headers, timeout=MODELS_TIMEOUT_S)
        response.raise_for_status()
        models = response.json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise ServeBenchError(f"could not list the models at {url} ({type(exc).__name__}: "
                              f"{exc}); start the server or pass the right --base-url") from exc
    if not models:
        raise ServeBenchError(f"{url} lists no model; pass --model NAME")
    return models[0]["id"]


def resolve_tokenizer(tokenizer: Path | None, model: str,
                      builtin_checkpoint: Callable[[], Path] | None = None
                      ) -> tuple[Tokenizer, str]:
    """(tokenizer, where it came from) by the rule of the module docstring;
    `builtin_checkpoint()` is the built-in checkpoint's directory."""
    from server.launch import DEFAULT_MODEL_NAME

    if tokenizer is None and Path(model).is_dir():
        tokenizer = Path(model)
    if tokenizer is None and model == DEFAULT_MODEL_NAME and builtin_checkpoint is not None:
        tokenizer = builtin_checkpoint()
    if tokenizer is None:
        raise ServeBenchError(f"cannot tell which tokenizer the model {model!r} uses; pass "
                              "--tokenizer DIR (the checkpoint directory the server serves) so "
                              "that every prompt has exactly --input-len tokens")
    try:
        return Tokenizer.from_pretrained(tokenizer), str(tokenizer)
    except ValueError as exc:
        raise ServeBenchError(f"--tokenizer: {exc}") from exc


def prompt_format(options: ServeOptions) -> str:
    """"token-ids" (the default on /v1/completions) or "text" (the default, and the only form,
    on /v1/chat/completions)."""
    is_chat = endpoint_kind(options.endpoint) == CHAT
    if options.prompt_format == "token-ids" and is_chat:
        raise ServeBenchError("chat messages carry text: --prompt-format token-ids works with "
                              "--endpoint /v1/completions only")
    return options.prompt_format or ("text" if is_chat else "token-ids")


def build_requests(options: ServeOptions, tokenizer: Tokenizer) -> list[RequestSpec]:
    """The random workload (module docstring)."""
    rng = np.random.default_rng(options.seed)
    input_lens = sample_lengths(options.num_prompts, options.input_len, options.range_ratio, rng)
    output_lens = sample_lengths(options.num_prompts, options.output_len, options.range_ratio,
                                 rng)
    as_text = prompt_format(options) == "text"
    pool = ordinary_token_ids(tokenizer)
    words = word_token_ids(tokenizer, pool) if as_text else pool
    if as_text and len(words) == 0:
        raise ServeBenchError("the tokenizer has no word tokens (a space and letters) to build "
                              "text prompts of an exact length from; use --endpoint "
                              "/v1/completions with --prompt-format token-ids")
    specs = []
    for n, m in zip(input_lens, output_lens):
        if as_text:
            text, count = random_text(tokenizer, words, n, rng)
            specs.append(RequestSpec(text, count, m))
        else:
            specs.append(RequestSpec(random_token_ids(pool, n, rng), n, m))
    mismatched = sum(s.prompt_len != n for s, n in zip(specs, input_lens))
    if mismatched:
        logger.warning("%d of %d text prompts encode to a token count off their target",
                       mismatched, len(specs))
    return specs


def arrival_delays(num: int, request_rate: float, rng: np.random.Generator) -> list[float]:
    """Seconds after the start at which each request is sent: 0 for all at rate inf, else the
    cumulative exponential gaps of a Poisson process of `request_rate` requests/s."""
    if request_rate == float("inf"):
        return [0.0] * num
    return np.cumsum(rng.exponential(1.0 / request_rate, size=num)).tolist()


async def run_requests(options: ServeOptions, client: httpx.AsyncClient, model: str,
                       specs: list[RequestSpec]) -> tuple[list[RequestResult], float]:
    """Send every request with its arrival time and the concurrency bound; -> (results in
    request order, wall seconds of the run)."""
    kind = endpoint_kind(options.endpoint)
    url = options.base_url + options.endpoint
    headers = auth_headers(options)
    limit = (asyncio.Semaphore(options.max_concurrency) if options.max_concurrency
             else contextlib.nullcontext())
    delays = arrival_delays(len(specs), options.request_rate,
                            np.random.default_rng(options.seed + 1))
    bar = tqdm(total=len(specs), disable=options.disable_tqdm, desc="requests")

    async def one(spec: RequestSpec, delay: float, start: float) -> RequestResult:
        await asyncio.sleep(max(0.0, start + delay - time.perf_counter()))
        arrived = time.perf_counter()
        async with limit:
            result = await send_request(
                client, url, request_body(kind, model, spec, options.ignore_eos,
                                          options.temperature),
                spec.prompt_len, headers, options.request_timeout)
        result.client_queue_time = result.start_time - arrived
        bar.update(1)
        return result

    start = time.perf_counter()
    results = await asyncio.gather(*(one(s, d, start) for s, d in zip(specs, delays)))
    duration = time.perf_counter() - start
    bar.close()
    return list(results), duration


async def benchmark(options: ServeOptions, percentiles: list[float], goodput: dict[str, float],
                    builtin_checkpoint: Callable[[], Path] | None = None) -> dict:
    """The whole run; -> the result (metrics, per-request lists, settings)."""
    base = options.base_url.rstrip("/")
    options = ServeOptions(**{**vars(options), "base_url": base})
    timeout = httpx.Timeout(options.request_timeout, connect=min(options.request_timeout, 30.0))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        model = options.model or await first_model(client, base, auth_headers(options))
        tokenizer, tokenizer_id = resolve_tokenizer(options.tokenizer, model, builtin_checkpoint)
        specs = build_requests(options, tokenizer)
        if options.num_warmups:
            warmup = ServeOptions(**{**vars(options), "num_prompts": options.num_warmups,
                                     "seed": options.seed + WARMUP_SEED_OFFSET,
                                     "disable_tqdm": True})
            await run_requests(warmup, client, model, build_requests(warmup, tokenizer))
        counters_before = await read_spec_counters(client, base, auth_headers(options))
        results, duration = await run_requests(options, client, model, specs)
        counters_after = await read_spec_counters(client, base, auth_headers(options))
    for result in results:
        if result.success and result.output_tokens is None:   # the server sent no usage
            result.output_tokens = len(tokenizer.encode(result.generated_text))
    metrics = compute_metrics(results, duration, percentiles, goodput)
    return {
        "date": dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if endpoint_kind(options.endpoint) == CHAT else "openai",
        "base_url": base, "endpoint": options.endpoint, "model_id": model,
        "tokenizer_id": tokenizer_id, "num_prompts": options.num_prompts,
        "input_len": options.input_len, "output_len": options.output_len,
        "range_ratio": options.range_ratio,
        # vLLM writes an unbounded rate as the string "inf" (JSON has no infinity)
        "request_rate": options.request_rate if options.request_rate < float("inf") else "inf",
        "max_concurrency": options.max_concurrency, "ignore_eos": options.ignore_eos,
        "prompt_format": prompt_format(options),
        "seed": options.seed, "num_warmups": options.num_warmups, "percentiles": percentiles,
        "goodput": goodput or None,
        "duration": duration, **metrics,
        "spec_decode": spec_decode_figures(counters_before, counters_after),
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_tokens or 0 for r in results],
        "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
        "latencies": [r.latency for r in results],
        "queue_times": [r.client_queue_time for r in results],
        "generated_texts": [r.generated_text for r in results],
        "errors": [r.error for r in results],
    }


def error_summary(errors: list[str]) -> str:
    """The distinct errors of failed requests with their counts, most frequent first."""
    counts = Counter(e for e in errors if e)
    lines = [f"{n} request(s) failed: {error}" for error, n in counts.most_common(MAX_ERRORS_SHOWN)]
    if len(counts) > MAX_ERRORS_SHOWN:
        lines.append(f"... and {len(counts) - MAX_ERRORS_SHOWN} more distinct errors (see the "
                     "result file's errors)")
    return "\n".join(lines)


def report(result: dict, selected: list[str]) -> str:
    """The table, with the failures' errors above it."""
    rate = result["request_rate"]
    table = format_report(result, result["duration"], result["max_concurrency"],
                          float(rate), selected, result["percentiles"])
    if result.get("spec_decode"):
        table += "\n" + format_spec_decode(result["spec_decode"])
    errors = error_summary(result["errors"])
    return f"{errors}\n{table}" if errors else table
