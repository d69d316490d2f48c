"""Stops the server when its engine has stopped (another rank died, a failure outside a step).

A server whose engine is gone can only answer errors; a load balancer should see it fail and
a supervisor restart it. So once the engine thread has stopped, ``/health`` answers 503 for
``grace_s`` seconds (for health checkers polling it), and then the server shuts down and
`serve` returns exit code 1 after logging why.
"""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)

POLL_S = 0.2
HEALTH_GRACE_S = 2.0


class EngineWatchdog:
    def __init__(self, server, app, grace_s: float = HEALTH_GRACE_S):
        self.server, self.app, self.grace_s = server, app, grace_s
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._watch, name="atomk31-engine-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        while not self.server.should_exit:
            engine = getattr(self.app.state, "engine", None)
            if self.server.started and engine is not None and not engine.is_alive:
                error = getattr(engine, "error", None)
                self.failure = f"{error}" if error is not None else "the engine thread stopped"
                logger.error("the engine stopped: %s; /health fails and the server exits in "
                             "%.0f s", self.failure, self.grace_s)
                time.sleep(self.grace_s)
                self.server.should_exit = True
                return
            time.sleep(POLL_S)
