"""Checks the chart's monitoring as Prometheus and Grafana would load it,
without a cluster, in the chart rendered with monitoring on:

1. the alerts (templates/prometheusrule.yaml): the rule groups pass
   `promtool check rules`, and `promtool test rules` runs
   tests/alerts/engram.test.yaml against them: each alert fires when its
   condition has held long enough, with its labels and rendered
   annotations, and not before nor when healthy;
2. the dashboard (templates/dashboard.yaml, dashboards/engram.json): panel
   ids unique, panels inside the 24-column grid and not overlapping, every
   query on the dashboard's data source variable, and every query valid
   PromQL (each is loaded by promtool as a recording rule, Grafana's
   variables replaced by values of their kind);
3. every metric the alerts and the dashboard name is one a running
   `engram serve` exports (a rule or a panel on a misspelt or renamed
   metric shows nothing): the binary, ENGRAM_BIN or target/debug/engram,
   is started on an SQLite file with an embedder configured (so the outbox
   is counted), called once by the CLI, and its /metrics scraped until
   every name is there, for at most 30 seconds.

usage: check_monitoring.py PROMTOOL RENDERED.yaml
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


#: Grafana's variables in the dashboard's queries, as values of their kind.
VARIABLES = {"$__rate_interval": "5m", "$namespace": "memory", "$job": "engram"}


def only(objects: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [
        o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)
    ]
    if len(found) != 1:
        raise SystemExit(f"{len(found)} {kind}s named *{name_suffix}, expected one")
    return found[0]


def named_metrics(exprs: list[str]) -> set[str]:
    names = set()
    for expr in exprs:
        names.update(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))
    return names - PROMETHEUS_OWN


def dashboard_queries(dashboard: dict) -> tuple[list[str], list[str]]:
    """The dashboard's queries with Grafana's variables replaced, and what
    is wrong with its layout and data sources."""
    problems, queries, ids, cells = [], [], set(), []
    for panel in dashboard["panels"]:
        where = f"panel {panel.get('id')} ({panel.get('title')})"
        if panel.get("id") in ids:
            problems.append(f"{where}: its id is taken")
        ids.add(panel.get("id"))
        grid = panel["gridPos"]
        if grid["x"] < 0 or grid["w"] <= 0 or grid["x"] + grid["w"] > 24:
            problems.append(f"{where}: outside the 24-column grid")
        cell = (grid["x"], grid["y"], grid["x"] + grid["w"], grid["y"] + grid["h"])
        for other, other_cell in cells:
            if cell[0] < other_cell[2] and other_cell[0] < cell[2] and cell[1] < other_cell[3] and other_cell[1] < cell[3]:
                problems.append(f"{where}: overlaps {other}")
        cells.append((where, cell))
        if panel["type"] == "row":
            continue
        if not panel.get("targets"):
            problems.append(f"{where}: no query")
        refs = [t["refId"] for t in panel.get("targets", [])]
        if len(set(refs)) != len(refs):
            problems.append(f"{where}: two queries share a refId")
        for source in [panel.get("datasource"), *(t.get("datasource") for t in panel.get("targets", []))]:
            if source != {"type": "prometheus", "uid": "${datasource}"}:
                problems.append(f"{where}: data source {source}, not the dashboard's variable")
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            if "$" in expr:
                problems.append(f"{where}: an unknown variable in {target['expr']}")
            queries.append(expr)
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for variable in VARIABLES:
        if not variable.startswith("$__") and variable[1:] not in defined:
            problems.append(f"the queries use {variable}, which the dashboard does not define")
    return queries, problems


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
    objects = [o for o in yaml.safe_load_all(rendered.read_text()) if o]
    groups = only(objects, "PrometheusRule")["spec"]["groups"]
    dashboard = json.loads(only(objects, "ConfigMap", "-dashboard")["data"]["engram.json"])
    queries, problems = dashboard_queries(dashboard)
    panel_rules = [
        {"record": f"dashboard:query_{n}", "expr": query} for n, query in enumerate(queries)
    ]
    with tempfile.TemporaryDirectory() as work:
        rules = Path(work) / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        shutil.copy(TESTS, Path(work) / TESTS.name)
        subprocess.run([promtool, "check", "rules", str(rules)], check=True)
        subprocess.run([promtool, "test", "rules", str(Path(work) / TESTS.name)], check=True)
        panels = Path(work) / "dashboard.yaml"
        panels.write_text(
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": panel_rules}]}, sort_keys=False)
        )
        print(f"the dashboard's {len(queries)} queries, as recording rules:")
        subprocess.run([promtool, "check", "rules", str(panels)], check=True)

    wanted = named_metrics([rule["expr"] for group in groups for rule in group["rules"]] + queries)
    binary = os.environ.get("ENGRAM_BIN", str(ROOT / "target" / "debug" / "engram"))
    exported = exported_metrics(binary, wanted)
    problems += [
        f"the monitoring names {name}, which engram serve does not export"
        for name in sorted(wanted - exported)
    ]
    for problem in problems:
        print(f"  FAIL {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"  the {len(wanted)} metrics the alerts and the dashboard name are all exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
