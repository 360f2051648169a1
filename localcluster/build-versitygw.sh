#!/usr/bin/env bash
# Build versitygw (an S3 API server over a directory, Apache-2.0: the local cluster's object
# store, which honours the conditional writes `If-None-Match: *` and `If-Match` the checkpoint
# commit rests on) from its upstream Go module into the cache. Idempotent: a binary already
# present is kept. Prints the binary's path as its last line.
#
#   VERSITYGW_VERSION  pinned release
#   FSDPOP_CACHE       cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.8.0}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
OUT="$CACHE/versitygw-$VERSITYGW_VERSION/bin"

if [ ! -x "$OUT/versitygw" ]; then
  mkdir -p "$OUT"
  GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local GOBIN="$OUT" \
    go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION" >&2
fi
echo "$OUT/versitygw"
