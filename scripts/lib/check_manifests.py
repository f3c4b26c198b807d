"""Validates rendered chart manifests without a cluster.

Every object is checked against the Kubernetes OpenAPI schemas of the given
version (strict: unknown fields are errors); the ServiceMonitor and the
PrometheusRule, CRDs those schemas lack, against the fields Prometheus
Operator requires (check_monitoring.py checks the rules themselves). Every pod
template must carry the restricted security settings. The chart's values
files are validated against values.schema.json.

Every ENGRAM_* variable the chart sets must be one `engram serve --help`
documents (an unknown one would be silently ignored); the binary is
ENGRAM_BIN, or target/debug/engram.

usage: check_manifests.py K8S_VERSION CHART_DIR RENDERED.yaml...
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

def prometheus_operator(spec: dict[str, Any]) -> dict[str, Any]:
    """A schema of a Prometheus Operator object whose spec is `spec`."""
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "spec": spec},
    }


SERVICE_MONITOR = prometheus_operator(
    {
        "type": "object",
        "required": ["selector", "endpoints"],
        "properties": {
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "object", "required": ["port", "path"]},
            }
        },
    }
)

RULE = {
    "type": "object",
    "required": ["alert", "expr"],
    "additionalProperties": False,
    "properties": {
        "alert": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "labels": {"type": "object"},
        "annotations": {"type": "object"},
    },
}

PROMETHEUS_RULE = prometheus_operator(
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "properties": {"rules": {"type": "array", "items": RULE}},
                },
            }
        },
    }
)
CUSTOM_RESOURCES = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    template = obj.get("spec", {}).get("template", {})
    return [template["spec"]] if "spec" in template else []


def check_security(where: str, pod: dict[str, Any]) -> list[str]:
    problems = []
    context = pod.get("securityContext", {})
    if context.get("runAsNonRoot") is not True:
        problems.append(f"{where}: pod runAsNonRoot is not true")
    if context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{where}: pod seccompProfile is not RuntimeDefault")
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: the service account token is mounted")
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name = f"{where}/{container['name']}"
        sc = container.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: the root filesystem is writable")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{name}: capabilities are not all dropped")
        if "resources" not in container:
            problems.append(f"{name}: no resources")
    return problems


def documented_settings() -> set[str]:
    binary = os.environ.get("ENGRAM_BIN", "target/debug/engram")
    help_text = subprocess.run(
        [binary, "serve", "--help"], check=True, capture_output=True, text=True
    ).stdout
    return set(re.findall(r"env: (ENGRAM_[A-Z0-9_]+)", help_text))


def set_variables(obj: dict[str, Any]) -> list[str]:
    if obj["kind"] == "ConfigMap":
        return list(obj.get("data", {}))
    names = []
    for pod in pod_specs(obj):
        for container in pod.get("containers", []):
            names.extend(e["name"] for e in container.get("env", []))
    return names


def main() -> int:
    version, chart, *files = sys.argv[1:]
    problems: list[str] = []
    known = documented_settings()

    schema = json.loads((Path(chart) / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    for values in [Path(chart) / "values.yaml", *sorted((Path(chart) / "ci").glob("*.yaml"))]:
        for error in jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load(values.read_text())):
            problems.append(f"{values}: {error.json_path}: {error.message}")

    for file in files:
        objects = [o for o in yaml.safe_load_all(Path(file).read_text()) if o]
        kinds = sorted({o["kind"] for o in objects})
        print(f"  {Path(file).name}: {len(objects)} objects ({', '.join(kinds)})")
        for obj in objects:
            where = f"{Path(file).name}: {obj['kind']}/{obj['metadata']['name']}"
            if obj["kind"] in CUSTOM_RESOURCES:
                for error in jsonschema.Draft7Validator(CUSTOM_RESOURCES[obj["kind"]]).iter_errors(obj):
                    problems.append(f"{where}: {error.message}")
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(f"{where}: {error.message} at {list(error.path)}")
            for pod in pod_specs(obj):
                problems.extend(check_security(where, pod))
            for name in set_variables(obj):
                if name.startswith("ENGRAM_") and name not in known:
                    problems.append(f"{where}: {name} is no setting of engram serve")

    for problem in problems:
        print(f"  FAIL {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
