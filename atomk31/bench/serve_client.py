"""One streamed request to an OpenAI-compatible server, timed as `vllm bench serve` times it.

Timings (seconds, client side, from just before the request is sent):
- ttft: until the first chunk that carries generated output: any completions chunk with a
  choice (its `text` may be empty, e.g. for a special token or part of a character: vLLM's
  client counts it too), or a chat chunk with `content` / `reasoning_content` / `tool_calls`
  or a finish reason. A chat stream's opening chunk that only names the role carries nothing
  generated and does not count.
- itl: the gaps between successive such chunks ("per chunk": a chunk may hold several tokens).
- latency (E2EL): until the last such chunk.
output_tokens comes from the stream's final usage chunk (requested with
`stream_options.include_usage`); when a server sends none, the caller counts the text's tokens.
A request fails (success False, `error` says why) on a non-200 answer, an error object inside
the stream, a stream without generated output, a transport error or the `timeout_s` deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from atomk31.bench.errors import BenchmarkError

MAX_ERROR_CHARS = 500
COMPLETIONS, CHAT = "completions", "chat"


@dataclass(frozen=True)
class RequestSpec:
    """What to send: a prompt (token ids or text) of prompt_len tokens, output_len to generate."""

    prompt: list[int] | str
    prompt_len: int
    output_len: int


@dataclass
class RequestResult:
    """What came back; field names follow vLLM's RequestFuncOutput."""

    prompt_len: int
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None
    generated_text: str = ""
    start_time: float = 0.0          # perf_counter() when sent
    client_queue_time: float = 0.0   # waiting for a --max-concurrency slot


def endpoint_kind(endpoint: str) -> str:
    """"chat" for a .../chat/completions endpoint, "completions" for .../completions."""
    if endpoint.rstrip("/").endswith("chat/completions"):
        return CHAT
    if endpoint.rstrip("/").endswith("completions"):
        return COMPLETIONS
    raise BenchmarkError(f"--endpoint must end with /completions or /chat/completions, got "
                     f"{endpoint!r}")


def request_body(kind: str, model: str, spec: RequestSpec, ignore_eos: bool,
                 temperature: float | None) -> dict:
    """The JSON body of one streamed request."""
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if kind == CHAT:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        body["max_completion_tokens"] = spec.output_len
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = spec.output_len
    if ignore_eos:
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = temperature
    return body


async def send_request(client: httpx.AsyncClient, url: str, body: dict, prompt_len: int,
                       headers: dict[str, str], timeout_s: float) -> RequestResult:
    """Send `body` to `url` and time its stream (module docstring); never raises."""
    result = RequestResult(prompt_len=prompt_len, start_time=time.perf_counter())
    try:
        await asyncio.wait_for(_stream(client, url, body, headers, result), timeout_s)
    except asyncio.TimeoutError:
        result.error = (f"no complete answer within {timeout_s:g} s; raise --request-timeout "
                        "if the server is just slow")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    result.success = not result.error
    return result


async def _stream(client: httpx.AsyncClient, url: str, body: dict, headers: dict[str, str],
                  result: RequestResult) -> None:
    last = None
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            result.error = f"HTTP {response.status_code}: {text[:MAX_ERROR_CHARS]}"
            return
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue                                  # blank separators, comments, events
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            now = time.perf_counter()
            payload = json.loads(data)
            if "error" in payload:
                error = payload["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                result.error = f"error in the stream: {message}"[:MAX_ERROR_CHARS]
                return
            if _record_chunk(payload, result, now, last):
                last = now
            usage = payload.get("usage")
            if usage:
                result.output_tokens = usage.get("completion_tokens", result.output_tokens)
                result.prompt_len = usage.get("prompt_tokens") or result.prompt_len
    if last is None:
        result.error = "the stream carried no generated output, so it has no TTFT"
        return
    result.latency = last - result.start_time


def _record_chunk(payload: dict, result: RequestResult, now: float, last: float | None) -> bool:
    """Add a chunk's output to `result`; True when it carried generated output."""
    choices = payload.get("choices") or []
    if not choices:
        return False
    choice = choices[0]
    delta = choice.get("delta") or {}
    text = choice.get("text") or ""
    text += (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    is_completion = "text" in choice            # a completions choice, empty text or not
    carries_output = is_completion or bool(text or delta.get("tool_calls")
                                           or choice.get("finish_reason"))
    if not carries_output:
        return False
    if last is None:
        result.ttft = now - result.start_time
    else:
        result.itl.append(now - last)
    result.generated_text += text
    return True
