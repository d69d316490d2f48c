"""The requests lm-eval's `local-completions` and `local-chat-completions` send, over real HTTP
(lm_eval/models/openai_completions.py, api_models.py, utils.RemoteTokenizer), answered in the
shapes lm-eval parses, with logprob values checked against the oracle (issue 19)."""

from __future__ import annotations

import httpx
import pytest
import torch

from atomk31.reference import ReferenceModel

MODEL = "tiny-test"
SEED = 1234   # lm-eval's default


@pytest.fixture(scope="module")
def reference(tiny_checkpoint) -> ReferenceModel:
    return ReferenceModel.from_pretrained(tiny_checkpoint, index_key_format="fp8")


def loglikelihood_payload(prompt, max_tokens: int = 1) -> dict:
    """LocalCompletionsAPI._create_payload(generate=False)."""
    return {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens,
            "logprobs": 1, "seed": SEED, "echo": True}


def parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """LocalCompletionsAPI.parse_logprobs, as lm-eval writes it."""
    result = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        tops = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        is_greedy = all(tok == max(top.values()) for tok, top in zip(logprobs, tops))
        result.append((sum(logprobs), is_greedy))
    return result


def oracle_logprobs(reference: ReferenceModel, ids: list[int]) -> list[float]:
    """log p(ids[p] | ids[:p]) for p >= 1."""
    logprobs = reference.forward(torch.tensor(ids)).log_softmax(-1)
    return [logprobs[p - 1, ids[p]].item() for p in range(1, len(ids))]


@pytest.mark.parametrize("tokenized", [True, False], ids=["token-ids", "strings"])
@pytest.mark.parametrize("max_tokens", [1, 0])
def test_loglikelihood_batch(live_server, reference, tokenized, max_tokens):
    """A batch of (context, continuation) pairs as lm-eval sends them: token id lists
    (tokenized_requests=True) or their text (False), echo, logprobs=1, max_tokens 1 (lm-eval
    today) or 0 (older versions and other harnesses)."""
    with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
        pairs = [("The capital of France is", " Paris"), ("2 + 2 =", " 4"), ("Hi", " there")]
        encode = [client.post("/tokenize", json={"prompt": text, "add_special_tokens": False}
                              ).json()["tokens"] for pair in pairs for text in pair]
        contexts, continuations = encode[0::2], encode[1::2]
        inputs = [c + k for c, k in zip(contexts, continuations)]
        prompt = inputs if tokenized else [client.post("/detokenize", json={"tokens": ids}
                                                       ).json()["prompt"] for ids in inputs]
        out = client.post("/v1/completions", json=loglikelihood_payload(prompt, max_tokens))
    assert out.status_code == 200, out.text
    out = out.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for choice, ids in zip(sorted(out["choices"], key=lambda c: c["index"]), inputs):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + max_tokens
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        expected = oracle_logprobs(reference, ids)
        assert lp["token_logprobs"][1:len(ids)] == pytest.approx(expected, abs=2e-3)
        assert all(len(top) in (1, 2) for top in lp["top_logprobs"][1:])
        echoed = live_server.engine.tokenizer.decode(ids)
        assert choice["text"] == echoed if max_tokens == 0 else choice["text"].startswith(echoed)
    results = parse_logprobs(out, [len(c) for c in contexts])
    for (total, is_greedy), context, ids in zip(results, contexts, inputs):
        expected = oracle_logprobs(reference, ids)[len(context) - 1:]
        if max_tokens == 0:   # lm-eval's [ctxlen:-1] then leaves out the last prompt token
            expected = expected[:-1]
        assert total == pytest.approx(sum(expected), abs=5e-3)
        assert isinstance(is_greedy, bool)


def test_generate_until_batch(live_server):
    """LocalCompletionsAPI._create_payload(generate=True): a batch of strings with stop
    sequences; choices come back by index."""
    payload = {"prompt": ["Question: 1 + 1?\nAnswer:", "Say hi:"], "model": MODEL,
               "max_tokens": 8, "temperature": 0, "stop": ["\n\n", "Question:"], "seed": SEED}
    with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
        out = client.post("/v1/completions", json=payload).json()
        again = client.post("/v1/completions", json=payload).json()
    texts = [None] * len(out["choices"])
    for choice in out["choices"]:
        texts[choice["index"]] = choice["text"]
        assert choice["finish_reason"] in ("stop", "length")
        assert "\n\n" not in choice["text"] and "Question:" not in choice["text"]
    assert texts == [c["text"] for c in sorted(again["choices"], key=lambda c: c["index"])]


def test_chat_completions_request(live_server):
    """LocalChatCompletion._create_payload: one conversation per request, stop[:4]."""
    payload = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "model": MODEL,
               "max_tokens": 8, "temperature": 0, "stop": ["<|im_end|>"], "seed": SEED}
    with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
        out = client.post("/v1/chat/completions", json=payload)
    assert out.status_code == 200, out.text
    [choice] = out.json()["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] is None or isinstance(choice["message"]["content"], str)


def test_remote_tokenizer_routes(live_server):
    """What lm_eval.utils.check_remote_tokenizer_support and RemoteTokenizer call."""
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        info = client.get("/tokenizer_info").json()
        tokens = client.post("/tokenize", json={"prompt": "test <|open|>",
                                                "add_special_tokens": False}).json()["tokens"]
        text = client.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    tokenizer = live_server.engine.tokenizer
    assert info["eos_token"] == "[EOS]" and "model_max_length" in info
    assert tokens == tokenizer.encode("test <|open|>") and text == "test <|open|>"
