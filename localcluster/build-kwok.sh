#!/usr/bin/env bash
# Build kwok (fake nodes and pods driven by stages) from its upstream Go module into the cache,
# and copy the stage files the simulated fleet uses out of that module's source. Idempotent: a
# binary or stage file already present is kept. Prints the kwok directory as its last line:
#   <dir>/bin/kwok, <dir>/stages/*.yaml
#
#   KWOK_VERSION  pinned kwok release
#   FSDPOP_CACHE  cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
DIR="$CACHE/kwok-$KWOK_VERSION"
OUT="$DIR/bin"
WORK="$DIR/src"
STAGES="$DIR/stages"
# kwok v0.8.0 starts with no stages unless given some: nodes turn Ready and keep a lease, pods
# turn Running and go when deleted, and a labelled Running pod's container fails (chaos).
STAGE_FILES=(
  node/fast/node-initialize.yaml
  node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml
  pod/fast/pod-complete.yaml
  pod/fast/pod-delete.yaml
  pod/chaos/pod-container-running-failed.yaml
)

mkdir -p "$OUT" "$WORK" "$STAGES"
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

missing=()
for f in "${STAGE_FILES[@]}"; do [ -s "$STAGES/${f//\//-}" ] || missing+=("$f"); done
if [ ! -x "$OUT/kwok" ] || [ ${#missing[@]} -gt 0 ]; then
  cd "$WORK"
  if [ ! -f go.mod ]; then
    go mod init fsdpop.local/kwokbuild >/dev/null 2>&1
    printf 'package main\nimport _ "sigs.k8s.io/kwok/cmd/kwok"\nfunc main() {}\n' > tools.go
    go get "sigs.k8s.io/kwok@$KWOK_VERSION"
    go mod tidy
  fi
  src=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  for f in "${missing[@]}"; do
    cp "$src/kustomize/stage/$f" "$STAGES/${f//\//-}.tmp"
    chmod 0644 "$STAGES/${f//\//-}.tmp"
    mv "$STAGES/${f//\//-}.tmp" "$STAGES/${f//\//-}"
  done
  if [ ! -x "$OUT/kwok" ]; then
    echo "building kwok ($KWOK_VERSION)..." >&2
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
      -o "$OUT/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
    mv "$OUT/kwok.tmp" "$OUT/kwok"
  fi
fi
echo "$DIR"
