"""`atomk31 serve --tensor-parallel-size 2` on CPU (issue 18): the server starts its second
rank itself, answers the official OpenAI client as one process would, and when a rank dies
``/health`` fails and the server exits with a message naming the rank (no hang)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from atomk31 import LLM, SamplingParams

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240
EXIT_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServeProcess:
    """`python -m atomk31.cli serve ...` in a subprocess, its log in a file."""

    def __init__(self, checkpoint: Path, log: Path, *flags: str):
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._log_file = open(log, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "atomk31.cli", "serve", "--model", str(checkpoint),
             "--port", str(self.port), "--block-size", "16", "--kernel-backend", "torch",
             "--served-model-name", "tiny", "--max-num-seqs", "8", *flags],
            cwd=ROOT, stdout=self._log_file, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.is_healthy():
            assert self.process.poll() is None, f"the server exited: {self.output()}"
            assert time.monotonic() < deadline, f"no /health 200 in {START_TIMEOUT_S} s"
            time.sleep(0.3)

    def is_healthy(self) -> bool:
        return self.health() == 200

    def health(self) -> int | None:
        try:
            return httpx.get(self.base_url + "/health", timeout=2).status_code
        except httpx.TransportError:
            return None

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text()

    def worker_pids(self) -> list[int]:
        match = re.search(r"started ranks 1\.\.\d+ \(pids \[([\d, ]+)\]\)", self.output())
        assert match, self.output()
        return [int(p) for p in match.group(1).split(",")]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


@pytest.fixture(scope="module")
def tp2_server(tiny_checkpoint, tmp_path_factory):
    server = ServeProcess(tiny_checkpoint, tmp_path_factory.mktemp("serve") / "serve.log",
                          "--tensor-parallel-size", "2")
    yield server
    server.stop()


def test_tp2_server_answers_the_openai_client_as_one_process(tp2_server, tiny_checkpoint):
    client = openai.OpenAI(base_url=tp2_server.base_url + "/v1", api_key="unused",
                           max_retries=0)
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4,
        stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    prompt = list(range(40, 110))
    completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=6,
                                           temperature=0.0)
    alone = LLM(tiny_checkpoint, block_size=16, kernel_backend="torch", max_num_seqs=8)
    expected = alone.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))
    assert completion.choices[0].text == expected[0].outputs[0].text


def test_a_dead_rank_fails_health_and_the_server_exits_with_a_message(tp2_server):
    (worker,) = tp2_server.worker_pids()
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    seen = []
    while tp2_server.process.poll() is None and time.monotonic() < deadline:
        seen.append(tp2_server.health())
        time.sleep(0.1)
    assert tp2_server.process.poll() is not None, "the server did not exit after a rank died"
    assert 503 in seen, f"/health never failed before the exit: {sorted(set(map(str, seen)))}"
    assert tp2_server.process.returncode == 1
    output = tp2_server.output()
    assert f"rank 1 (pid {worker}) exited with code -9" in output, output[-3000:]
    assert "exiting: the engine stopped" in output, output[-3000:]
