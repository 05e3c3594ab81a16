# tests/lib/go_build.sh — sourced by the tests' Go build scripts (tests/otelcol/build.sh,
# tests/k8svalidate/build.sh), which define `die` first: the steps both take before
# compiling, kept in one place so that the two stay alike.

# lock_cache_dir DIR: creates DIR and holds its lock (fd 9) until the script exits, so that
# concurrent callers wait for one build.
lock_cache_dir() {
    mkdir -p "$1" 2>/dev/null && [ -w "$1" ] ||
        die "cannot write the cache directory $1: run as root or set TAILTRAP_VMTEST_CACHE to a writable directory"
    exec 9>"$1/.lock"
    flock 9
}

# find_go GO_MOD WHAT: sets `go` to a Go toolchain at least as new as GO_MOD's go line (on
# PATH or in /usr/local/go/bin) and `have` to its version, or dies saying that WHAT needs
# it. GOTOOLCHAIN=local: an older Go fails here instead of fetching another toolchain.
find_go() {
    local need
    need=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$1")
    go=$(command -v go || true)
    [ -n "$go" ] || [ ! -x /usr/local/go/bin/go ] || go=/usr/local/go/bin/go
    [ -n "$go" ] || die "no Go toolchain: install Go $need or newer (on PATH or in /usr/local/go/bin) to build $2"
    export GOTOOLCHAIN=local
    have=$("$go" env GOVERSION 2>/dev/null | sed 's/^go//') || have=
    [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" = "$need" ] ||
        die "$go is Go ${have:-of unknown version}; building $2 needs Go $need or newer"
    [ -n "$("$go" env GOMODCACHE)" ] && [ "$("$go" env GOCACHE)" != off ] ||
        die "Go has no module or build cache here: set HOME (or GOMODCACHE and GOCACHE)"
}
