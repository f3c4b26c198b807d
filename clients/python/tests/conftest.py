"""Starts the real engram binary on an ephemeral port with a temp store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ENGRAM_BIN = os.environ.get(
    "ENGRAM_BIN", str(Path(__file__).resolve().parents[3] / "target" / "debug" / "engram")
)


@dataclass
class Server:
    process: subprocess.Popen[str]
    address: str
    database_url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def start_server(
    database_url: str, grpc_addr: str = "127.0.0.1:0", env: dict[str, str] | None = None
) -> Server:
    """Runs `engram serve` and waits for the log line saying where it listens."""
    process = subprocess.Popen(
        [ENGRAM_BIN, "serve", "--grpc-addr", grpc_addr, "--http-addr", "127.0.0.1:0"],
        env={
            **os.environ,
            "ENGRAM_DATABASE_URL": database_url,
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_SHUTDOWN_GRACE_SECS": "2",
            **(env or {}),
        },
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "grpc_addr" in event:
            # Keep draining stderr so the server never blocks on a full pipe.
            import threading

            threading.Thread(target=process.stderr.read, daemon=True).start()
            return Server(process, event["grpc_addr"], database_url)
    raise RuntimeError(f"engram exited before listening (status {process.wait()})")


@pytest.fixture
def database_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield f"sqlite://{directory}/engram.db"


@pytest.fixture
def server(database_url: str) -> Iterator[Server]:
    running = start_server(database_url)
    yield running
    running.stop()
