#!/usr/bin/env bash
# Build the local cluster's control-plane binaries from the upstream Go modules, into a cache
# outside the repository. Idempotent: a binary already present is kept.
#
#   KUBE_VERSION  pinned Kubernetes release (staging modules follow as v0.<minor>.<patch>)
#   ETCD_VERSION  pinned etcd release
#   COREDNS_VERSION  pinned CoreDNS release (built with only the plugins the Corefile names)
#   The volume provisioner builds from provisioner/ next to this script (its go.mod pins the
#   sig-storage provisioner library), again whenever that source changes; netpol (NetworkPolicy
#   enforcement, the kube-network-policies library) likewise from netpol/.
#   FSDPOP_CACHE  cache root (default ~/.cache/fsdp-operator)
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE="${FSDPOP_CACHE:-$HOME/.cache/fsdp-operator}"
OUT="$CACHE/k8s-$KUBE_VERSION/bin"
WORK="$CACHE/k8s-$KUBE_VERSION/src"
PROVISIONER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/provisioner" && pwd)"
NETPOL_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/netpol" && pwd)"
# The node side (kubelet, kube-proxy) and kubeadm (certificates, kubeconfigs) build from the same
# module graph: ~40 s more each.
KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kubeadm)

mkdir -p "$OUT" "$WORK/kube" "$WORK/etcd" "$WORK/coredns"
export GOFLAGS="-mod=mod" CGO_ENABLED=0 GOTOOLCHAIN=local

missing=()
for c in "${KUBE_CMDS[@]}"; do [ -x "$OUT/$c" ] || missing+=("$c"); done

build_kube() {
  [ ${#missing[@]} -gt 0 ] || return 0
  cd "$WORK/kube"
  if [ ! -f go.mod ]; then
    go mod init fsdpop.local/kubebuild >/dev/null 2>&1
    # k8s.io/kubernetes pins its staging modules to v0.0.0 with local replaces; point each one
    # at the published v0.<minor>.<patch> release instead.
    modfile=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    staging="v0.${KUBE_VERSION#v1.}"
    python3 - "$modfile" "$staging" "$KUBE_VERSION" >>go.mod <<'PY'
import re, sys
modfile, staging, kube = sys.argv[1:]
names = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", open(modfile).read(), re.M)
print(f"\nrequire k8s.io/kubernetes {kube}\n")
print("replace (")
for n in sorted(set(names)):
    print(f"\t{n} => {n} {staging}")
print(")")
PY
    printf 'package main\nimport (\n' > tools.go
    for c in "${KUBE_CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c" >> tools.go; done
    printf ')\nfunc main() {}\n' >> tools.go
    go mod tidy
  fi
  # One `go build` for all of them: their links (single-threaded, tens of seconds each) overlap.
  echo "building ${missing[*]} ($KUBE_VERSION)..." >&2
  rm -rf "$OUT/.kube.tmp" && mkdir -p "$OUT/.kube.tmp"
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" \
    -o "$OUT/.kube.tmp/" "${missing[@]/#/k8s.io/kubernetes/cmd/}"
  for c in "${missing[@]}"; do mv "$OUT/.kube.tmp/$c" "$OUT/$c"; done
  rmdir "$OUT/.kube.tmp"
}

build_etcd() {
  [ ! -x "$OUT/etcd" ] || return 0
  cd "$WORK/etcd"
  if [ ! -f go.mod ]; then
    go mod init fsdpop.local/etcdbuild >/dev/null 2>&1
    printf 'package main\nimport _ "go.etcd.io/etcd/server/v3"\nfunc main() {}\n' > tools.go
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
  fi
  echo "building etcd ($ETCD_VERSION)..." >&2
  go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$OUT/etcd.tmp" "$OUT/etcd"
}

build_coredns() {
  [ ! -x "$OUT/coredns" ] || return 0
  cd "$WORK/coredns"
  if [ ! -f go.mod ]; then
    go mod init fsdpop.local/corednsbuild >/dev/null 2>&1
    # CoreDNS's own main links every plugin (cloud DNS APIs, tracing agents: minutes more to
    # fetch and build); its documented alternative is a main that sets the directive list.
    cat > main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

// In CoreDNS's plugin.cfg order: the order plugins see a query in.
func init() { dnsserver.Directives = []string{"bind", "ready", "errors", "template", "kubernetes"} }

func main() { coremain.Run() }
GO
    go get "github.com/coredns/coredns@$COREDNS_VERSION"
    go mod tidy
  fi
  echo "building coredns ($COREDNS_VERSION)..." >&2
  go build -trimpath -ldflags "-s -w" -o "$OUT/coredns.tmp" .
  mv "$OUT/coredns.tmp" "$OUT/coredns"
}

# Our own Go mains (a source dir with go.mod, go.sum, main.go): keyed by their hash, not by a
# version. readonly: a build never rewrites the go.mod and go.sum it was given.
build_local() {
  local name=$1 src=$2 hash
  hash=$(cd "$src" && cat go.mod go.sum main.go | sha256sum | cut -d' ' -f1)
  if [ ! -x "$OUT/$name" ] || [ "$(cat "$OUT/$name.source" 2>/dev/null)" != "$hash" ]; then
    echo "building $name..." >&2
    (cd "$src" && GOFLAGS=-mod=readonly go build -buildvcs=false -trimpath \
      -ldflags "-s -w" -o "$OUT/$name.tmp" .)
    mv "$OUT/$name.tmp" "$OUT/$name"
    echo "$hash" >"$OUT/$name.source"
  fi
}
# Two chains side by side: on a fresh machine the Go builds are most of a first `make test`'s
# install time, and one build alone leaves a core idle while it links or downloads modules.
(build_kube) &
kube=$!
(build_etcd)
(build_coredns)
build_local local-dir-provisioner "$PROVISIONER_SRC"
# NetworkPolicy enforcement: the upstream kube-network-policies controller, one per node, in
# one process (netpol/main.go says why).
build_local netpol "$NETPOL_SRC"
wait "$kube"
echo "$OUT"
