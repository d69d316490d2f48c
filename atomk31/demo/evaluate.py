"""`atomk31 eval`: the built-in model's task families scored through a server's OpenAI API.

Each instance (eval split, `--seed`) is sent as a chat completion (`messages`, and `tools` where
the instance offers them), greedy (`temperature` 0), `--concurrency` at a time; the reply's
`choices[0].message` is scored by scoring.py. Works against any OpenAI-compatible server (the
standard library's HTTP client: no extra dependency). Prints one table row per family (passkey
per length, tools with its sub-checks) and writes the numbers as JSON with `--result-file`.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from atomk31.demo.scoring import Score, score_reply
from atomk31.demo.tasks import FAMILIES, Example, check_families, generate
from atomk31.demo.tasks.passkey import EVAL_LENGTHS

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
# Completion budgets: a two-digit product's working is the longest (about 300 tokens).
MAX_TOKENS = {"arithmetic": 512, "passkey": 64, "tools": 160, "chat": 64}
SUB_CHECKS = ("schema_valid", "right_call", "uses_result", "text_answer")


class ServerError(RuntimeError):
    """The server could not be reached or answered with an error."""


@dataclass
class EvalOptions:
    base_url: str = DEFAULT_BASE_URL
    tasks: tuple[str, ...] = FAMILIES
    num_per_task: int = 25
    seed: int = 0
    concurrency: int = 4
    passkey_lengths: tuple[int, ...] = EVAL_LENGTHS
    model: str | None = None
    api_key: str | None = None
    max_tokens: int | None = None       # overrides MAX_TOKENS for every family
    timeout_s: float = 600.0


class ChatClient:
    """POSTs JSON to an OpenAI-compatible `/v1` base URL."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float) -> None:
        self.base_url, self.api_key, self.timeout_s = base_url.rstrip("/"), api_key, timeout_s

    def _request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ServerError(f"{path} answered HTTP {exc.code}: "
                              f"{exc.read().decode(errors='replace')[:300]}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"could not reach the server at {self.base_url} ({exc}); start one "
                              f"with `atomk31 serve` or pass --base-url") from exc

    def first_model(self) -> str:
        models = self._request("/models").get("data") or []
        if not models:
            raise ServerError(f"{self.base_url}/models lists no model; pass --model")
        return models[0]["id"]

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("/chat/completions", body)


def instances(options: EvalOptions) -> list[tuple[str, Example]]:
    """(group, instance) pairs: groups are family names, passkey ones `passkey@LENGTH`."""
    work = []
    for family in options.tasks:
        if family == "passkey":
            work += [(f"passkey@{length}",
                      generate("passkey", "eval", options.seed, i, num_tokens=length))
                     for length in options.passkey_lengths for i in range(options.num_per_task)]
        else:
            work += [(family, generate(family, "eval", options.seed, i))
                     for i in range(options.num_per_task)]
    return work


def request_body(example: Example, model: str, max_tokens: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": example.messages, "temperature": 0.0,
                            "max_tokens": max_tokens or MAX_TOKENS[example.family]}
    if example.tools:
        body["tools"] = example.tools
    return body


def _run_one(client: ChatClient, example: Example, model: str, max_tokens: int | None
             ) -> tuple[Score, int | None, str | None]:
    """(score, prompt tokens, error): a failed request scores as wrong and keeps its error."""
    try:
        reply = client.chat(request_body(example, model, max_tokens))
        message = (reply.get("choices") or [{}])[0].get("message")
    except ServerError as exc:
        return Score(False, note=str(exc)), None, str(exc)
    return score_reply(example, message), (reply.get("usage") or {}).get("prompt_tokens"), None


def _summarise(group_results: list[tuple[Example, Score, int | None, str | None]]
               ) -> dict[str, Any]:
    scores = [score for _, score, _, _ in group_results]
    summary: dict[str, Any] = {"n": len(scores),
                               "accuracy": sum(s.correct for s in scores) / len(scores),
                               "errors": sum(error is not None for *_, error in group_results)}
    for check in SUB_CHECKS:
        values = [s.checks[check] for s in scores if check in s.checks]
        if values:
            summary[check] = sum(values) / len(values)
            summary[f"{check}_n"] = len(values)
    prompt_tokens = [tokens for _, _, tokens, _ in group_results if tokens is not None]
    if prompt_tokens:
        summary["mean_prompt_tokens"] = round(sum(prompt_tokens) / len(prompt_tokens))
    return summary


def run_eval(options: EvalOptions) -> dict[str, Any]:
    """Score every instance through the server; returns the result document."""
    check_families(list(options.tasks))
    if options.num_per_task < 1 or options.concurrency < 1:
        raise ValueError(f"--num-per-task and --concurrency must be >= 1, got "
                         f"{options.num_per_task} and {options.concurrency}")
    client = ChatClient(options.base_url, options.api_key, options.timeout_s)
    model = options.model or client.first_model()
    work = instances(options)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=options.concurrency) as pool:
        outcomes = list(pool.map(lambda item: _run_one(client, item[1], model, options.max_tokens),
                                 work))
    grouped: dict[str, list] = defaultdict(list)
    for (group, example), (score, tokens, error) in zip(work, outcomes):
        grouped[group].append((example, score, tokens, error))
    return {"base_url": options.base_url, "model": model, "seed": options.seed,
            "num_per_task": options.num_per_task, "tasks": list(options.tasks),
            "elapsed_s": round(time.monotonic() - started, 1),
            "results": {group: _summarise(results) for group, results in grouped.items()}}


def format_table(result: dict[str, Any]) -> str:
    """The results as a text table: task | n | accuracy | sub-checks."""
    lines = [f"{'task':<16} {'n':>4} {'accuracy':>9}  details", "-" * 64]
    for group, summary in result["results"].items():
        details = [f"{c} {summary[c]:.3f} (n={summary[c + '_n']})" for c in SUB_CHECKS
                   if c in summary]
        if "mean_prompt_tokens" in summary and group.startswith("passkey"):
            details.append(f"prompt ~{summary['mean_prompt_tokens']} tokens")
        if summary["errors"]:
            details.append(f"{summary['errors']} request errors")
        lines.append(f"{group:<16} {summary['n']:>4} {summary['accuracy']:>9.3f}  "
                     + ", ".join(details))
    return "\n".join(lines)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `atomk31 eval`."""
    defaults = EvalOptions()
    parser.add_argument("--base-url", "--base_url", dest="base_url", default=defaults.base_url,
                        help=f"the server's OpenAI base URL (default {DEFAULT_BASE_URL})")
    parser.add_argument("--tasks", default=",".join(FAMILIES),
                        help=f"comma-separated task families (default {','.join(FAMILIES)})")
    parser.add_argument("--num-per-task", "--num_per_task", dest="num_per_task", type=int,
                        default=defaults.num_per_task, help="instances per family (passkey: per "
                        "length)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--passkey-lengths", "--passkey_lengths", dest="passkey_lengths",
                        default=",".join(map(str, EVAL_LENGTHS)),
                        help="comma-separated prompt lengths in tokens")
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
    parser.add_argument("--api-key", "--api_key", dest="api_key", default=None)
    parser.add_argument("--max-tokens", "--max_tokens", dest="max_tokens", type=int, default=None,
                        help="completion budget for every family (default: per family)")
    parser.add_argument("--result-file", "--result_file", dest="result_file", default=None,
                        help="write the results as JSON here")


def options_from_args(args: argparse.Namespace) -> EvalOptions:
    try:
        lengths = tuple(int(v) for v in args.passkey_lengths.split(",") if v.strip())
    except ValueError as exc:
        raise ValueError(f"--passkey-lengths must be comma-separated integers, got "
                         f"{args.passkey_lengths!r}") from exc
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    return EvalOptions(base_url=args.base_url, tasks=tasks, num_per_task=args.num_per_task,
                       seed=args.seed, concurrency=args.concurrency, passkey_lengths=lengths,
                       model=args.model, api_key=args.api_key, max_tokens=args.max_tokens)


def cmd_eval(args: argparse.Namespace) -> int:
    """`atomk31 eval`: print the table, write `--result-file`; 1 when the server is unusable."""
    try:
        result = run_eval(options_from_args(args))
    except (ServerError, ValueError) as exc:
        print(f"atomk31 eval: {exc}")
        return 1
    print(f"model {result['model']} at {result['base_url']}, seed {result['seed']}, "
          f"{result['elapsed_s']} s")
    print(format_table(result))
    if args.result_file:
        with open(args.result_file, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")
    return 0
