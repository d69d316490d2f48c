"""The FastAPI app: routes, the engine's lifespan and the dependencies that reach it.

`create_app(options, served_model_name, api_key)` builds the app; the engine is built in the
lifespan (never at import, never a module global) and kept on `app.state`, where the
dependencies below find it. Tests may pass a ready `engine`, which the app then uses and does
not shut down.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/messages (Anthropic),
POST /v1/messages/count_tokens, GET /v1/models, GET /v1/models/{id}, and vLLM's POST /tokenize,
POST /detokenize, GET /tokenizer_info (all behind the API key when one is set); GET /health,
GET /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from atomk31 import __version__
from atomk31.config import EngineConfig
from atomk31.engine.async_engine import AsyncEngine
from server.anthropic_protocol import (
    CountTokensRequest, CountTokensResponse, MessagesRequest, MessagesResponse,
)
from server.auth import require_api_key
from server.errors import install_error_handlers
from server.metrics import ServerMetrics
from server.limits import ServerLimits
from server.protocol import (
    ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
    ErrorResponse, ModelCard, ModelList,
)
from server.request_body import parsed_body
from server.serving_chat import create_chat_completion
from server.serving_common import check_model, max_model_len
from server.serving_completions import create_completion
from server.serving_messages import count_tokens, create_message
from server.serving_tokenize import router as tokenizer_routes

logger = logging.getLogger(__name__)

ERROR_RESPONSES = {status: {"model": ErrorResponse} for status in (400, 401, 404, 500, 503)}


# ---- dependencies ----------------------------------------------------------------------------
def get_engine(request: Request) -> AsyncEngine:
    return request.app.state.engine


def get_metrics(request: Request) -> ServerMetrics:
    return request.app.state.metrics


def get_served_model_name(request: Request) -> str:
    return request.app.state.served_model_name


# ---- /v1 (behind the API key) ----------------------------------------------------------------
v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERROR_RESPONSES)


@v1.post("/chat/completions", response_model=ChatCompletionResponse)
async def chat_completions(request: Request,
                           body: ChatCompletionRequest = Depends(
                               parsed_body(ChatCompletionRequest)),
                           engine: AsyncEngine = Depends(get_engine),
                           metrics: ServerMetrics = Depends(get_metrics),
                           model_name: str = Depends(get_served_model_name)
                           ) -> ChatCompletionResponse | Response:
    return await create_chat_completion(body, request, engine, metrics, model_name)


@v1.post("/completions", response_model=CompletionResponse)
async def completions(request: Request,
                      body: CompletionRequest = Depends(parsed_body(CompletionRequest)),
                      engine: AsyncEngine = Depends(get_engine),
                      metrics: ServerMetrics = Depends(get_metrics),
                      model_name: str = Depends(get_served_model_name)
                      ) -> CompletionResponse | Response:
    return await create_completion(body, request, engine, metrics, model_name)


@v1.post("/messages", response_model=MessagesResponse)
async def messages(request: Request,
                   body: MessagesRequest = Depends(parsed_body(MessagesRequest)),
                   engine: AsyncEngine = Depends(get_engine),
                   metrics: ServerMetrics = Depends(get_metrics),
                   model_name: str = Depends(get_served_model_name)
                   ) -> MessagesResponse | Response:
    """Anthropic's Messages API (errors in Anthropic's shape)."""
    return await create_message(body, request, engine, metrics, model_name)


@v1.post("/messages/count_tokens")
async def messages_count_tokens(request: Request,
                                body: CountTokensRequest = Depends(
                                    parsed_body(CountTokensRequest)),
                                engine: AsyncEngine = Depends(get_engine),
                                model_name: str = Depends(get_served_model_name)
                                ) -> CountTokensResponse:
    return await count_tokens(body, request, engine, model_name)


@v1.get("/models")
async def list_models(request: Request, engine: AsyncEngine = Depends(get_engine),
                      model_name: str = Depends(get_served_model_name)) -> ModelList:
    return ModelList(data=[_model_card(request, engine, model_name)])


@v1.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request,
                         engine: AsyncEngine = Depends(get_engine),
                         model_name: str = Depends(get_served_model_name)) -> ModelCard:
    check_model(model_id, model_name)
    return _model_card(request, engine, model_name)


def _model_card(request: Request, engine: AsyncEngine, model_name: str) -> ModelCard:
    return ModelCard(id=model_name, created=request.app.state.started_at,
                     max_model_len=max_model_len(engine))


# ---- open routes -------------------------------------------------------------------------------
service = APIRouter()


@service.get("/health")
async def health(engine: AsyncEngine = Depends(get_engine)) -> Response:
    """200 while the engine thread serves; 503 once it has stopped."""
    if engine.is_alive:
        return Response(content='{"status":"ok"}', media_type="application/json")
    return Response(content='{"status":"engine stopped"}', status_code=503,
                    media_type="application/json")


@service.get("/metrics")
async def metrics_endpoint(metrics: ServerMetrics = Depends(get_metrics)) -> Response:
    return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ---- the app -------------------------------------------------------------------------------------
def create_app(options: EngineConfig | None, served_model_name: str, api_key: str | None = None,
               engine: AsyncEngine | None = None, limits: ServerLimits | None = None) -> FastAPI:
    """The server for one model. `options` build the engine at start-up; or pass a running
    `engine` (then `options` may be None and the app does not shut the engine down).
    `limits`: what one request may cost before it reaches the engine (server/limits.py)."""
    if options is None and engine is None:
        raise ValueError("create_app needs EngineConfig options or a running AsyncEngine; "
                         "got neither")
    if api_key is not None and not api_key:
        raise ValueError("api_key must be a non-empty string or None (no key); got ''")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owns_engine = engine is None
        running = engine if engine is not None else await asyncio.to_thread(AsyncEngine, options)
        app.state.engine = running
        app.state.metrics = ServerMetrics(running)
        app.state.started_at = int(time.time())
        logger.info("serving %r (context length %d tokens)%s", served_model_name,
                    max_model_len(running), "; API key required" if api_key else "")
        try:
            yield
        finally:
            if owns_engine:
                await asyncio.to_thread(running.shutdown)

    app = FastAPI(title="atomk31", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible server for Kimi K3.1 Pro")
    app.state.served_model_name = served_model_name
    app.state.api_key = api_key
    app.state.limits = limits or ServerLimits()
    install_error_handlers(app)
    app.include_router(v1)
    app.include_router(tokenizer_routes)
    app.include_router(service)
    return app
