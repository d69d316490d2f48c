"""POST /tokenize, POST /detokenize, GET /tokenizer_info: vLLM's tokenizer routes.

lm-eval's `local-completions` looks for exactly these (`tokenizer_backend=remote`, or `auto`,
which probes them) to count context tokens for loglikelihood without downloading a tokenizer.
`/tokenize` encodes as `/v1/completions` does (special-token strings stay plain text), so the
token counts a client computes are the ones the server prompts with.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from server.auth import require_api_key
from server.protocol import RequestModel, ResponseModel
from server.request_body import parsed_body
from server.serving_common import max_model_len


class TokenizeRequest(RequestModel):
    prompt: str
    add_special_tokens: bool = False   # K3 prompts start with no BOS: nothing to add


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(RequestModel):
    tokens: list[int] = Field(max_length=1 << 24)


class DetokenizeResponse(ResponseModel):
    prompt: str


class TokenizerInfo(ResponseModel):
    tokenizer_class: str = "TikTokenTokenizer"
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    model_max_length: int


PAD_TOKEN = "[PAD]"
router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/tokenize")
async def tokenize(request: Request,
                   body: TokenizeRequest = Depends(parsed_body(TokenizeRequest))
                   ) -> TokenizeResponse:
    engine = request.app.state.engine
    tokens = engine.tokenizer.encode(body.prompt)
    return TokenizeResponse(count=len(tokens), max_model_len=max_model_len(engine),
                            tokens=tokens)


@router.post("/detokenize")
async def detokenize(request: Request,
                     body: DetokenizeRequest = Depends(parsed_body(DetokenizeRequest))
                     ) -> DetokenizeResponse:
    return DetokenizeResponse(prompt=request.app.state.engine.tokenizer.decode(body.tokens))


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> TokenizerInfo:
    engine = request.app.state.engine
    tokenizer = engine.tokenizer

    def name(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.decode([token_id])

    try:
        pad = name(tokenizer.token_id(PAD_TOKEN))
    except ValueError:   # a tokenizer without [PAD] (CHAT_FORMAT.md §1 lists it for K3)
        pad = None
    return TokenizerInfo(eos_token=name(tokenizer.eos_token_id),
                         bos_token=name(tokenizer.bos_token_id), pad_token=pad,
                         model_max_length=max_model_len(engine))
