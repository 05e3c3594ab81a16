#!/bin/bash
# fetch-kernels.sh [--update]
#
# Downloads the stock Debian kernels the VM tests boot and unpacks them into a cache, without
# installing anything on the host and without touching the host's apt sources or state:
#   6.1   newest linux-image-6.1.0-*-amd64 of bookworm (incl. bookworm-updates/-security)
#   6.12  linux-image-6.12.*+deb12-amd64 of bookworm-backports (what its linux-image-amd64 pulls in)
# apt runs with a private sources list, state and cache under the cache directory, so the
# packages are verified against Debian's signed Release files as usual.  Each kernel is unpacked
# with dpkg-deb -x and gets a modules.dep (depmod -b), so its modules load inside the guest.
#
# Layout:  $CACHE/kernels/<release>/{boot/vmlinuz-<release>,lib/modules/<release>}
#          $CACHE/6.1 and $CACHE/6.12: symlinks to the kernel directory of that series
# Idempotent: a series already unpacked is reused without network access; --update refreshes
# the package lists and fetches a newer kernel if Debian has one.
#
# Environment:
#   TAILTRAP_VMTEST_CACHE   cache directory (default /var/cache/tailtrap-vmtest)
#   TAILTRAP_DEBIAN_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   TAILTRAP_DEBIAN_SECURITY_MIRROR  (default http://deb.debian.org/debian-security)
#   TAILTRAP_KERNEL_PKG_6_1, TAILTRAP_KERNEL_PKG_6_12   pin an exact linux-image package name
# Prints one line per series: "<series> <release> <kernel dir>".  Exit status != 0 on failure.

set -euo pipefail
PROG=${0##*/}
die() { echo "$PROG: $*" >&2; exit 1; }

UPDATE=0
case ${1:-} in
    --update) UPDATE=1 ;;
    "") ;;
    *) die "usage: $PROG [--update]" ;;
esac

CACHE=${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}
MIRROR=${TAILTRAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECMIRROR=${TAILTRAP_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SERIES=(6.1 6.12)

for t in apt-get apt-cache dpkg-deb depmod; do
    command -v $t >/dev/null || die "$t not found (a Debian/Ubuntu host is needed: apt, dpkg, kmod)"
done

mkdir -p "$CACHE/kernels" "$CACHE/debs" || die "cannot create $CACHE (set TAILTRAP_VMTEST_CACHE)"
# One fetch at a time per cache: concurrent runs would race on the apt state and the unpacking.
exec 9>"$CACHE/.fetch.lock"
flock 9

complete() { [ -L "$CACHE/$1" ] && [ -f "$CACHE/$1/.complete" ]; }

need_fetch=$UPDATE
for s in "${SERIES[@]}"; do complete "$s" || need_fetch=1; done

if [ $need_fetch = 1 ]; then
    [ -r "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
    A=$CACHE/apt
    mkdir -p "$A/sources.list.d" "$A/preferences.d" "$A/state/lists/partial" "$A/cache/archives/partial"
    : > "$A/sources.list"; : > "$A/status"; : > "$A/preferences"
    cat > "$A/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Architectures: amd64
Signed-By: $KEYRING

Types: deb
URIs: $SECMIRROR
Suites: bookworm-security
Components: main
Architectures: amd64
Signed-By: $KEYRING
SRC
    # Everything apt reads or writes is redirected here; only the host's general settings
    # (apt.conf.d: proxies and the like) still apply, as the user would expect.
    APT=(-o "Dir::Etc::SourceList=$A/sources.list" -o "Dir::Etc::SourceParts=$A/sources.list.d"
         -o "Dir::Etc::Preferences=$A/preferences" -o "Dir::Etc::PreferencesParts=$A/preferences.d"
         -o "Dir::State=$A/state" -o "Dir::State::status=$A/status" -o "Dir::Cache=$A/cache"
         -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
         -o "APT::Sandbox::User=root" -o "Acquire::Languages=none"
         -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
         -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
         -o "APT::Update::Post-Invoke-Success::=" -o "APT::Update::Post-Invoke::=")
    echo "$PROG: refreshing Debian package lists (private apt state in $A)" >&2
    apt-get -q "${APT[@]}" update >&2 || die "apt-get update failed (network? mirror $MIRROR)"

    # The meta package linux-image-amd64 depends on the newest image of its suite.  Without -t
    # the candidate comes from bookworm(-updates/-security); backports (NotAutomatic) only wins
    # with -t bookworm-backports.
    meta_dep() {   # meta_dep PATTERN [apt-cache option...]
        local pat=$1; shift
        apt-cache "${APT[@]}" "$@" depends linux-image-amd64 |
            awk -v pat="$pat" '$1 ~ /Depends:$/ && $2 ~ pat {print $2; exit}'
    }
    declare -A PKG
    PKG[6.1]=${TAILTRAP_KERNEL_PKG_6_1:-$(meta_dep '^linux-image-6\.1\.0-[0-9]+-amd64$')}
    PKG[6.12]=${TAILTRAP_KERNEL_PKG_6_12:-$(meta_dep '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' -t bookworm-backports)}

    for s in "${SERIES[@]}"; do
        pkg=${PKG[$s]}
        [ -n "$pkg" ] || die "no linux-image package found for $s (set TAILTRAP_KERNEL_PKG_${s//./_})"
        kver=${pkg#linux-image-}
        dir=$CACHE/kernels/$kver
        if [ ! -f "$dir/.complete" ]; then
            echo "$PROG: downloading $pkg" >&2
            (cd "$CACHE/debs" && apt-get -q "${APT[@]}" download "$pkg" >&2) || die "apt-get download $pkg failed"
            debs=("$CACHE/debs/$pkg"_*.deb); deb=${debs[-1]}
            [ -f "$deb" ] || die "apt-get download left no $pkg .deb in $CACHE/debs"
            rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
            echo "$PROG: unpacking $deb" >&2
            dpkg-deb -x "$deb" "$dir.tmp" || die "dpkg-deb -x $deb failed"
            [ -f "$dir.tmp/boot/vmlinuz-$kver" ] || die "$deb has no boot/vmlinuz-$kver"
            [ -d "$dir.tmp/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
            # The package ships no modules.dep (its postinst runs depmod): make it here.
            depmod -b "$dir.tmp" "$kver" || die "depmod for $kver failed"
            rm -rf "$dir"; mv "$dir.tmp" "$dir"
            touch "$dir/.complete"
            rm -f "$deb"   # the unpacked tree is all the runner needs
        fi
        ln -sfn "kernels/$kver" "$CACHE/$s"
    done
fi

for s in "${SERIES[@]}"; do
    complete "$s" || die "series $s is not available in $CACHE"
    dir=$(readlink -f "$CACHE/$s")
    echo "$s ${dir##*/} $dir"
done
