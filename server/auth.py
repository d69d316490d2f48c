"""The API-key check: one dependency on the /v1 router (STYLE.md §4, "In atomk31" #11).

When the server runs with `--api-key`, every /v1 request must send `Authorization: Bearer KEY`
(OpenAI's clients) or `x-api-key: KEY` (Anthropic's); the comparison is
`secrets.compare_digest`, whose time does not depend on where the strings differ. The check runs
before the body is read (server/request_body.py), so a request without the key gets 401 whatever
its body. /health and /metrics stay open, as in vLLM, for load balancers and Prometheus.
"""

from __future__ import annotations

import secrets

from fastapi import Request

from server.errors import APIError

BEARER_PREFIX = "bearer "


async def require_api_key(request: Request) -> None:
    """Raise a 401 unless the request carries the server's key (no-op when it has none)."""
    api_key: str | None = request.app.state.api_key
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    given = request.headers.get("x-api-key")
    if given is None:
        if not header.lower().startswith(BEARER_PREFIX):
            raise APIError(401, "missing API key: send the header 'Authorization: Bearer <key>' "
                           "(or 'x-api-key: <key>')", code="invalid_api_key")
        given = header[len(BEARER_PREFIX):].strip()
    if not secrets.compare_digest(given.encode(), api_key.encode()):
        raise APIError(401, "incorrect API key provided; pass the key the server was started "
                       "with (--api-key)", code="invalid_api_key")
