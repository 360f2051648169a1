#!/usr/bin/env bash
# Build krew (kubectl's plugin manager, Apache-2.0) from its upstream Go module into the cache:
# tests/cluster/test_release_artifacts.py installs the release's kubectl-fsdp archive with it,
# from the manifest hack/krew.py fills in, as a user's `kubectl krew install` would. No cluster.
# Idempotent: a binary already present is kept. Prints the binary's path as its last line.
#
#   KREW_VERSION   pinned release
#   FSDPOP_CACHE   cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

KREW_VERSION="${KREW_VERSION:-v0.4.3}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
OUT="$CACHE/krew-$KREW_VERSION/bin"

if [ ! -x "$OUT/krew" ]; then
  mkdir -p "$OUT"
  GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$OUT" \
    go install "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION" >&2
fi
echo "$OUT/krew"
