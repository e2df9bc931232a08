#!/usr/bin/env bash
# Build the GitOps health tools of hack/gitops (Go): kstatus-verdict (Flux's kstatus library) and
# argocd-health (Argo CD's Lua interpreter, gopher-lua). Called by `make gitops-tools`
# (mk/image.mk) with the two output paths, which are keyed by a hash of the sources, so a binary
# is built once per version of hack/gitops and reused from $DISPATCH_CACHE/bin afterwards.
set -euo pipefail
cd "$(dirname "$0")/gitops"
kstatus_out="$1"
argocd_out="$2"
command -v go >/dev/null || { echo "build-gitops-tools: needs Go (https://go.dev/doc/install)" >&2; exit 1; }
for pair in "kstatus-verdict:$kstatus_out" "argocd-health:$argocd_out"; do
  cmd="${pair%%:*}"
  out="${pair#*:}"
  [ -x "$out" ] && continue
  echo "build-gitops-tools: go build ./$cmd -> $out" >&2
  start=$(date +%s)
  mkdir -p "$(dirname "$out")"
  go build -trimpath -o "$out.tmp" "./$cmd"
  mv "$out.tmp" "$out"
  echo "build-gitops-tools: $cmd built in $(( $(date +%s) - start )) s" >&2
done
