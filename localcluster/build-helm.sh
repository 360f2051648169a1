#!/usr/bin/env bash
# Build helm from its upstream Go module into the cache (for rendering the chart in tests).
# Idempotent; prints the binary's path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.19.0}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
BIN="$CACHE/helm-$HELM_VERSION/helm"
if [ ! -x "$BIN" ]; then
  echo "building helm $HELM_VERSION..." >&2
  GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$CACHE/helm-$HELM_VERSION" \
    go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
echo "$BIN"
