#!/usr/bin/env bash
# Build scheduler-plugins' kube-scheduler (the Coscheduling plugin: gang scheduling by PodGroup)
# from its upstream Go module into the cache, and copy the PodGroup CRD out of that module's
# source. Idempotent: what is already present is kept. Prints the directory as its last line:
# <dir>/bin/kube-scheduler, <dir>/crds/*.yaml (scheduling.x-k8s.io PodGroup and ElasticQuota)
#
#   SCHEDULER_PLUGINS_VERSION  pinned scheduler-plugins release (its go.mod says which Go)
#   FSDPOP_CACHE               cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

VERSION="${SCHEDULER_PLUGINS_VERSION:-v0.33.5}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
DIR="$CACHE/scheduler-plugins-$VERSION"
OUT="$DIR/bin"
WORK="$DIR/src"
MODULE="sigs.k8s.io/scheduler-plugins"

mkdir -p "$OUT" "$WORK"
# One build at a time: a test fixture that runs this waits here until another build is done.
exec 9>"$DIR/.build.lock"
flock 9
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

if [ ! -x "$OUT/kube-scheduler" ] || [ ! -d "$DIR/crds" ]; then
  cd "$WORK"
  if [ ! -f .resolved ]; then
    # `go install module@version` is refused for a module with replace directives, and this one
    # pins the k8s.io/* staging modules (required at v0.0.0) by them: they do not apply to a
    # module that requires it. So it is built from a module of our own that requires it, with
    # its replace directives copied in before anything is resolved.
    rm -f go.mod go.sum
    go mod init fsdpop.local/schedulerpluginsbuild >/dev/null 2>&1
    printf 'package main\nimport _ "%s/cmd/scheduler"\nfunc main() {}\n' "$MODULE" > tools.go
    go mod edit -require="$MODULE@$VERSION"
    mod=$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    go mod edit -json "$mod" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    old, new = r["Old"], r["New"]
    left = old["Path"] + ("@" + old["Version"] if old.get("Version") else "")
    right = new["Path"] + ("@" + new["Version"] if new.get("Version") else "")
    print(f"-replace={left}={right}")
' | xargs go mod edit
    go mod tidy
    touch .resolved
  fi
  src=$(go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf "$DIR/crds.tmp"
  mkdir -p "$DIR/crds.tmp"
  cp "$src"/config/crd/bases/scheduling.x-k8s.io_*.yaml "$DIR/crds.tmp/"
  chmod -R u+w,a+r "$DIR/crds.tmp"
  rm -rf "$DIR/crds"
  mv "$DIR/crds.tmp" "$DIR/crds"
  if [ ! -x "$OUT/kube-scheduler" ]; then
    echo "building scheduler-plugins' kube-scheduler ($VERSION)..." >&2
    go build -trimpath -ldflags "-s -w" -o "$OUT/kube-scheduler.tmp" "$MODULE/cmd/scheduler"
    mv "$OUT/kube-scheduler.tmp" "$OUT/kube-scheduler"
  fi
fi
echo "$DIR"
