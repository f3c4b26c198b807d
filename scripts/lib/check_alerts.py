"""Checks the chart's alerts (templates/prometheusrule.yaml) as Prometheus
would load them, without a cluster:

1. the rule groups of the rendered PrometheusRule pass `promtool check rules`;
2. `promtool test rules` runs tests/alerts/engram.test.yaml against them:
   each alert fires when its condition has held long enough, with its labels
   and rendered annotations, and not before nor when healthy;
3. every metric the rules name is one a running `engram serve` exports (a
   rule on a misspelt or renamed metric never fires): the binary, ENGRAM_BIN
   or target/debug/engram, is started on an SQLite file with an embedder
   configured (so the outbox is counted), called once by the CLI, and its
   /metrics scraped until every name is there, for at most 30 seconds.

usage: check_alerts.py PROMTOOL RENDERED.yaml
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

import yaml

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "alerts" / "engram.test.yaml"
# Series Prometheus makes itself rather than scrapes.
PROMETHEUS_OWN = {"up"}


def rule_groups(rendered: Path) -> list[dict]:
    rules = [
        o
        for o in yaml.safe_load_all(rendered.read_text())
        if o and o.get("kind") == "PrometheusRule"
    ]
    if len(rules) != 1:
        raise SystemExit(f"{rendered}: {len(rules)} PrometheusRules, expected one")
    return rules[0]["spec"]["groups"]


def named_metrics(groups: list[dict]) -> set[str]:
    names = set()
    for group in groups:
        for rule in group["rules"]:
            names.update(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["expr"]))
    return names - PROMETHEUS_OWN


def exported_metrics(binary: str, wanted: set[str]) -> set[str]:
    """The names a fresh server exports once called, scraped until all of
    `wanted` are there or 30 seconds have passed."""
    with tempfile.TemporaryDirectory() as data:
        env = {
            **os.environ,
            "ENGRAM_GRPC_ADDR": "127.0.0.1:0",
            "ENGRAM_HTTP_ADDR": "127.0.0.1:0",
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_DATABASE_URL": f"sqlite://{data}/engram.db",
            # Never answered: the worker counts the outbox all the same.
            "ENGRAM_EMBEDDER_URL": "http://127.0.0.1:9/v1/embeddings",
            "ENGRAM_EMBEDDER_MODEL": "check-alerts",
        }
        server = subprocess.Popen(
            [binary, "serve"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        # Read the log as it comes, so the server never blocks on a full pipe.
        events: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=read_events, args=(server.stderr, events), daemon=True).start()
        try:
            grpc = http = None
            while not (grpc and http):
                event = events.get(timeout=30)
                if event is None:
                    raise SystemExit(f"{binary} serve exited before listening")
                grpc, http = event.get("grpc_addr", grpc), event.get("http_addr", http)
            subprocess.run(
                [binary, "memory", "scopes", "--server", f"http://{grpc}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 30
            while True:
                with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as reply:
                    text = reply.read().decode()
                names = {
                    re.split(r"[{ ]", line, maxsplit=1)[0]
                    for line in text.splitlines()
                    if line and not line.startswith("#")
                }
                if wanted <= names or time.monotonic() > deadline:
                    return names
                time.sleep(0.2)
        finally:
            server.terminate()
            server.wait(timeout=30)


def read_events(stream: IO[str], events: queue.Queue[dict | None]) -> None:
    """Puts each JSON log event of `stream` on `events`, then None at its end."""
    for line in stream:
        try:
            events.put(json.loads(line))
        except ValueError:
            pass
    events.put(None)


def main() -> int:
    promtool, rendered = sys.argv[1], Path(sys.argv[2])
    groups = rule_groups(rendered)
    with tempfile.TemporaryDirectory() as work:
        rules = Path(work) / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        shutil.copy(TESTS, Path(work) / TESTS.name)
        subprocess.run([promtool, "check", "rules", str(rules)], check=True)
        subprocess.run([promtool, "test", "rules", str(Path(work) / TESTS.name)], check=True)

    wanted = named_metrics(groups)
    binary = os.environ.get("ENGRAM_BIN", str(ROOT / "target" / "debug" / "engram"))
    missing = sorted(wanted - exported_metrics(binary, wanted))
    for name in missing:
        print(f"  FAIL the alerts name {name}, which engram serve does not export", file=sys.stderr)
    if missing:
        return 1
    print(f"  the {len(wanted)} metrics the alerts name are all exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
