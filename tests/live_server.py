"""A real uvicorn server on loopback in a background thread, for tests that speak HTTP to the
app (tests/server, tests/bench, tests/demo)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from atomk31.engine.async_engine import AsyncEngine

START_TIMEOUT_S = 60


class LiveServer:
    """A uvicorn server running `app` on 127.0.0.1 in a daemon thread."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning",
                                                     timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start; see the log above")
            time.sleep(0.02)

    @property
    def engine(self) -> AsyncEngine:
        return self.app.state.engine

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
