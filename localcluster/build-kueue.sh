#!/usr/bin/env bash
# Build Kueue (the job queueing controller platform teams share GPUs with) from its upstream Go
# module into the cache, and copy the CRDs and webhook manifests it needs out of that module's
# source. Idempotent: what is already present is kept. Prints the Kueue directory as its last
# line: <dir>/bin/kueue, <dir>/crds/*.yaml, <dir>/webhook/manifests.yaml
#
#   KUEUE_VERSION  pinned Kueue release (needs Go >= 1.25)
#   FSDPOP_CACHE   cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
DIR="$CACHE/kueue-$KUEUE_VERSION"
OUT="$DIR/bin"
WORK="$DIR/src"

mkdir -p "$OUT" "$WORK"
# One build at a time: `make test` starts this beside pytest, whose Kueue fixture runs it too
# and then waits here until the first one is done.
exec 9>"$DIR/.build.lock"
flock 9
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

if [ ! -x "$OUT/kueue" ] || [ ! -s "$DIR/webhook/manifests.yaml" ] || [ ! -d "$DIR/crds" ]; then
  cd "$WORK"
  if [ ! -f go.mod ]; then
    go mod init fsdpop.local/kueuebuild >/dev/null 2>&1
    printf 'package main\nimport _ "sigs.k8s.io/kueue/cmd/kueue"\nfunc main() {}\n' > tools.go
    go get "sigs.k8s.io/kueue@$KUEUE_VERSION"
    go mod tidy
  fi
  src=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$DIR/crds.tmp" "$DIR/webhook.tmp"
  mkdir -p "$DIR/crds.tmp" "$DIR/webhook.tmp"
  cp "$src"/config/components/crd/bases/*.yaml "$DIR/crds.tmp/"
  cp "$src"/config/components/webhook/manifests.yaml "$DIR/webhook.tmp/"
  chmod -R u+w,a+r "$DIR/crds.tmp" "$DIR/webhook.tmp"
  rm -rf "$DIR/crds" "$DIR/webhook"
  mv "$DIR/crds.tmp" "$DIR/crds"
  mv "$DIR/webhook.tmp" "$DIR/webhook"
  if [ ! -x "$OUT/kueue" ]; then
    echo "building kueue ($KUEUE_VERSION)..." >&2
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
      -o "$OUT/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue
    mv "$OUT/kueue.tmp" "$OUT/kueue"
  fi
fi
echo "$DIR"
