# Pinned client tooling, installed on demand under target/tools (sourced by
# scripts/gen-clients and scripts/test). Bump a version here and rerun
# scripts/gen-clients to regenerate the committed clients.

GRPCIO_VERSION=1.85.1
MYPY_PROTOBUF_VERSION=5.1.0
MYPY_VERSION=2.4.1
PYTEST_VERSION=9.2.0
# The official MCP Python SDK, the client of the MCP tests.
MCP_VERSION=2.3.0
# LangGraph, its checkpoint interface and its conformance suite (the Python
# client's LangGraph tests).
LANGGRAPH_VERSION=1.2.22
LANGGRAPH_CHECKPOINT_VERSION=4.3.2
LANGGRAPH_CONFORMANCE_VERSION=0.0.2
# Google's Agent Development Kit (the Python client's ADK tests).
ADK_VERSION=2.13.0
TYPES_GRPCIO_VERSION=1.85.0.20261028
# Selenium drives Debian's headless Chromium in the console's tests.
SELENIUM_VERSION=4.51.0
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.1
GRPCURL_VERSION=v1.9.3

TOOLS_DIR=${TOOLS_DIR:-$PWD/target/tools}
PY_TOOLS=$TOOLS_DIR/py
GO_TOOLS=$TOOLS_DIR/go/bin
BROWSER_TOOLS=$TOOLS_DIR/browser

ensure_python_tools() {
  local stamp="$PY_TOOLS/.pinned-$GRPCIO_VERSION-$MYPY_PROTOBUF_VERSION-$MYPY_VERSION-$PYTEST_VERSION-$MCP_VERSION-$LANGGRAPH_VERSION-$LANGGRAPH_CHECKPOINT_VERSION-$LANGGRAPH_CONFORMANCE_VERSION-$ADK_VERSION"
  if [ ! -e "$stamp" ]; then
    rm -rf "$PY_TOOLS"
    python3 -m venv "$PY_TOOLS"
    "$PY_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
      "grpcio-tools==$GRPCIO_VERSION" "grpcio==$GRPCIO_VERSION" \
      "mypy-protobuf==$MYPY_PROTOBUF_VERSION" "mypy==$MYPY_VERSION" \
      "pytest==$PYTEST_VERSION" "types-grpcio==$TYPES_GRPCIO_VERSION" \
      "mcp==$MCP_VERSION" "langgraph==$LANGGRAPH_VERSION" \
      "langgraph-checkpoint==$LANGGRAPH_CHECKPOINT_VERSION" \
      "langgraph-checkpoint-conformance==$LANGGRAPH_CONFORMANCE_VERSION" \
      "google-adk==$ADK_VERSION"
    touch "$stamp"
  fi
}

# Debian's chromium and chromium-driver (installed when missing and root),
# and a venv with Selenium and pytest, for the console's browser tests.
ensure_browser_tools() {
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "Chromium is missing: run 'sudo apt-get install -y chromium chromium-driver'" >&2
      return 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
  local stamp="$BROWSER_TOOLS/.pinned-$SELENIUM_VERSION-$PYTEST_VERSION"
  if [ ! -e "$stamp" ]; then
    rm -rf "$BROWSER_TOOLS"
    python3 -m venv "$BROWSER_TOOLS"
    "$BROWSER_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
      "selenium==$SELENIUM_VERSION" "pytest==$PYTEST_VERSION"
    touch "$stamp"
  fi
}

ensure_go_tools() {
  mkdir -p "$GO_TOOLS"
  local want
  for want in \
    "protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION" \
    "protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION" \
    "grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"; do
    set -- $want
    local stamp="$GO_TOOLS/.$1-${2##*@}"
    if [ ! -x "$GO_TOOLS/$1" ] || [ ! -e "$stamp" ]; then
      GOBIN="$GO_TOOLS" GOFLAGS=-mod=mod go install "$2"
      rm -f "$GO_TOOLS/.$1-"*
      touch "$stamp"
    fi
  done
}

HELM_VERSION=v3.22.0
KUBERNETES_VALIDATE_VERSION=1.37.0
# The Kubernetes version the chart's manifests are validated against.
K8S_VERSION=1.33.0
K8S_TOOLS=$TOOLS_DIR/k8s
HELM=$GO_TOOLS/helm

ensure_chart_tools() {
  mkdir -p "$GO_TOOLS"
  local stamp="$GO_TOOLS/.helm-$HELM_VERSION"
  if [ ! -x "$HELM" ] || [ ! -e "$stamp" ]; then
    echo "installing helm $HELM_VERSION (go install; a few minutes the first time)"
    GOBIN="$GO_TOOLS" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    rm -f "$GO_TOOLS/.helm-"*
    touch "$stamp"
  fi
  stamp="$K8S_TOOLS/.pinned-$KUBERNETES_VALIDATE_VERSION"
  if [ ! -e "$stamp" ]; then
    rm -rf "$K8S_TOOLS"
    python3 -m venv "$K8S_TOOLS"
    "$K8S_TOOLS/bin/pip" install --quiet --disable-pip-version-check \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    touch "$stamp"
  fi
}

PROM_TOOLS=$TOOLS_DIR/prometheus
PROMTOOL=$PROM_TOOLS/promtool

# promtool, which checks and unit-tests the chart's alerts: unpacked from
# Debian's prometheus package (installing it would start a Prometheus).
ensure_promtool() {
  [ -x "$PROMTOOL" ] && return
  local work
  work=$(mktemp -d)
  if ! (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root prometheus 2>/dev/null); then
    if [ "$(id -u)" -ne 0 ]; then
      echo "promtool is missing: run 'sudo apt-get update', or put promtool at $PROMTOOL" >&2
      return 1
    fi
    apt-get update -qq
    (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root prometheus)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$PROM_TOOLS"
  cp "$work/x/usr/bin/promtool" "$PROMTOOL"
  rm -rf "$work"
}
