#!/usr/bin/env bash
# Debian packages the local cluster's nodes and image builds need; installs only what is
# missing (a no-op once installed). Needs root and Debian's package mirror.
set -euo pipefail
# command -> package
declare -A NEED=(
  [containerd]=containerd [runc]=runc [podman]=podman [debootstrap]=debootstrap
  [iptables]=iptables [conntrack]=conntrack [nsenter]=util-linux [ip]=iproute2
  [promtool]=prometheus   # the monitoring tests: Prometheus itself and promtool
)
missing=()
for cmd in "${!NEED[@]}"; do command -v "$cmd" >/dev/null || missing+=("${NEED[$cmd]}"); done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
[ -x /usr/bin/containerd-shim-runc-v2 ] || missing+=(containerd)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
