#!/bin/bash
# tests/k8svalidate/build.sh — builds the tools the chart tests use, from the Go modules
# pinned by go.mod and go.sum beside this script, and prints the directory holding them on
# stdout (progress goes to stderr):
#   helm         helm.sh/helm/v3/cmd/helm (go.mod's `tool` line), for `helm lint` and
#                `helm template`
#   k8svalidate  main.go: decodes rendered objects strictly into Kubernetes' API types
# One module for both, so the validator's k8s.io/api is the one helm itself was built with.
#
# Cached as ${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/k8svalidate/<hash>/, <hash>
# over go.mod, go.sum, main.go and this script: an unchanged tree reuses the binaries without Go or
# network. Concurrent callers wait for one build under a lock. With --cached-only it prints
# the cached directory or fails, and never builds.
#
# Needs Go >= go.mod's go line on PATH or in /usr/local/go/bin (GOTOOLCHAIN=local: an older
# Go fails here instead of fetching another toolchain).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
say() { printf 'k8svalidate/build.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

cache=${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/k8svalidate
hash=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh" | sha256sum | cut -c1-16)
out=$cache/$hash
done_() { [ -x "$out/helm" ] && [ -x "$out/k8svalidate" ]; }
if done_; then
    echo "$out"
    exit 0
fi
[ "${1:-}" != --cached-only ] || die "no cached helm and k8svalidate in $out (run tests/k8svalidate/build.sh first)"

# shellcheck source=tests/lib/go_build.sh
. "$here/../lib/go_build.sh"
lock_cache_dir "$out"
if done_; then
    echo "$out"
    exit 0
fi

find_go "$here/go.mod" "helm and the chart validator"

helm_version=$(sed -n 's/^[[:space:]]*helm.sh\/helm\/v3 \(v[0-9.]*\).*/\1/p' "$here/go.mod")
# The Kubernetes release helm assumes without a cluster (`helm template`, the lint's
# deprecation rules) is that of the client-go it is built with, as helm's own Makefile sets
# it: client-go v0.37.x is Kubernetes 1.37.
k8s_minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$here/go.mod")
[ -n "$helm_version" ] && [ -n "$k8s_minor" ] || die "go.mod names no helm.sh/helm/v3 or k8s.io/client-go version"
say "building helm $helm_version and k8svalidate with Go $have into $out (a cold build takes minutes)"
start=$SECONDS
cd "$here"
# -mod=readonly: go.sum must already hold every module; -buildvcs=false: no git call;
# CGO_ENABLED=0: static binaries.
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
"$go" mod download >&2 || die "downloading the Go modules failed (GOPROXY=$("$go" env GOPROXY))"
say "modules ready after $((SECONDS - start)) s; compiling"
tmp=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# helm prints its version from this variable; a module build does not set it otherwise.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$k8s_minor"
done
"$go" build -trimpath -ldflags="$ldflags" \
    -o "$tmp/helm" helm.sh/helm/v3/cmd/helm >&2 || die "go build of helm failed"
"$go" build -trimpath -ldflags='-s -w' -o "$tmp/k8svalidate" . >&2 || die "go build of k8svalidate failed"
mv "$tmp/k8svalidate" "$out/k8svalidate"
mv "$tmp/helm" "$out/helm"
say "built in $((SECONDS - start)) s (helm $(du -h "$out/helm" | cut -f1), k8svalidate $(du -h "$out/k8svalidate" | cut -f1))"
echo "$out"
