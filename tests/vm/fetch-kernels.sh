#!/bin/bash
# fetch-kernels.sh [--update]
#
# Downloads the stock Debian kernels the VM tests boot and unpacks them into a cache, without
# installing anything on the host and without touching the host's apt sources or state:
#   5.10  newest linux-image-5.10.0-*-amd64 of bullseye (Debian 11, incl. -updates/-security):
#         the oldest LTS kernel tailtrap supports
#   6.1   newest linux-image-6.1.0-*-amd64 of bookworm (incl. bookworm-updates/-security)
#   6.12  linux-image-6.12.*+deb12-amd64 of bookworm-backports (what its linux-image-amd64 pulls in)
#   unstable  the newest kernel of Debian's unstable suite (what sid's linux-image-amd64 pulls
#         in), so that a function or tracepoint a new kernel renames fails CI, not a user.
#         Refreshed when the cached one is more than UNSTABLE_MAX_AGE_DAYS (7) days old; a
#         failed refresh keeps the cached kernel (said on stderr).
# apt runs with a private sources list, state and cache under the cache directory, so the
# packages are verified against Debian's signed Release files as usual.  Each kernel is unpacked
# with dpkg-deb -x and gets a modules.dep (depmod -b), so its modules load inside the guest.
#
# Layout:  $CACHE/kernels/<release>/{boot/vmlinuz-<release>,lib/modules/<release>}
#          $CACHE/<series>: symlink to the kernel directory of that series
# Idempotent: a series already unpacked is reused without network access; --update refreshes
# the package lists and fetches a newer kernel if Debian has one.
#
# Environment:
#   TAILTRAP_VMTEST_CACHE   cache directory (default /var/cache/tailtrap-vmtest)
#   TAILTRAP_DEBIAN_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   TAILTRAP_DEBIAN_SECURITY_MIRROR  (default http://deb.debian.org/debian-security)
#   TAILTRAP_KERNEL_PKG_5_10, TAILTRAP_KERNEL_PKG_6_1, TAILTRAP_KERNEL_PKG_6_12,
#   TAILTRAP_KERNEL_PKG_UNSTABLE
#                           pin an exact linux-image package name
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
SERIES=(5.10 6.1 6.12 unstable)
UNSTABLE_MAX_AGE_DAYS=7

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
# The unstable suite moves: look for a newer kernel once a week.
stale_unstable=0
if complete unstable && [ -n "$(find "$CACHE/unstable/.complete" -mtime +$UNSTABLE_MAX_AGE_DAYS 2>/dev/null)" ]; then
    stale_unstable=1; need_fetch=1
fi

if [ $need_fetch = 1 ]; then
    [ -r "$KEYRING" ] || die "$KEYRING missing (apt-get install debian-archive-keyring)"
    A=$CACHE/apt
    mkdir -p "$A/sources.list.d" "$A/preferences.d" "$A/state/lists/partial" "$A/cache/archives/partial"
    : > "$A/sources.list"; : > "$A/status"
    # sid only where asked for (-t sid): otherwise its newer meta package would be the
    # candidate for the bookworm series too.
    printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' > "$A/preferences"
    cat > "$A/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Architectures: amd64
Signed-By: $KEYRING

Types: deb
URIs: $MIRROR
Suites: bullseye bullseye-updates
Components: main
Architectures: amd64
Signed-By: $KEYRING

Types: deb
URIs: $MIRROR
Suites: sid
Components: main
Architectures: amd64
Signed-By: $KEYRING

Types: deb
URIs: $SECMIRROR
Suites: bullseye-security bookworm-security
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
    if ! apt-get -q "${APT[@]}" update >&2; then
        # Only a weekly refresh of the unstable kernel failed: keep the cached kernels.
        if [ $UPDATE = 0 ] && complete 5.10 && complete 6.1 && complete 6.12 && complete unstable; then
            echo "$PROG: refreshing the package lists failed; keeping the cached kernels" >&2
            need_fetch=0
        else
            die "apt-get update failed (network? mirror $MIRROR)"
        fi
    fi
fi

if [ $need_fetch = 1 ]; then

    # The meta package linux-image-amd64 depends on the newest image of its suite.  Without -t
    # the candidate comes from bookworm(-updates/-security); backports (NotAutomatic) only wins
    # with -t bookworm-backports.
    meta_dep() {   # meta_dep PATTERN [apt-cache option...]
        local pat=$1; shift
        apt-cache "${APT[@]}" "$@" depends linux-image-amd64 |
            awk -v pat="$pat" '$1 ~ /Depends:$/ && $2 ~ pat {print $2; exit}'
    }
    declare -A PKG
    PKG[5.10]=${TAILTRAP_KERNEL_PKG_5_10:-$(meta_dep '^linux-image-5\.10\.0-[0-9]+-amd64$' -t bullseye)}
    PKG[6.1]=${TAILTRAP_KERNEL_PKG_6_1:-$(meta_dep '^linux-image-6\.1\.0-[0-9]+-amd64$')}
    PKG[6.12]=${TAILTRAP_KERNEL_PKG_6_12:-$(meta_dep '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' -t bookworm-backports)}
    PKG[unstable]=${TAILTRAP_KERNEL_PKG_UNSTABLE:-$(meta_dep '^linux-image-[0-9][^ ]*-amd64$' -t sid)}

    for s in "${SERIES[@]}"; do
        pkg=${PKG[$s]}
        [ -n "$pkg" ] || die "no linux-image package found for $s (set TAILTRAP_KERNEL_PKG_$(echo "${s//./_}" | tr a-z A-Z))"
        kver=${pkg#linux-image-}
        dir=$CACHE/kernels/$kver
        if [ ! -f "$dir/.complete" ]; then
            # Newer kernels (Debian 14 on) split the image into linux-binary-* (vmlinuz)
            # and linux-modules-* beside a small linux-image-*: take whichever exist.
            pkgs=("$pkg")
            for part in linux-binary linux-modules; do
                if apt-cache "${APT[@]}" show "$part-$kver" >/dev/null 2>&1; then
                    pkgs+=("$part-$kver")
                fi
            done
            echo "$PROG: downloading ${pkgs[*]}" >&2
            (cd "$CACHE/debs" && apt-get -q "${APT[@]}" download "${pkgs[@]}" >&2) || die "apt-get download ${pkgs[*]} failed"
            rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
            got=()
            for p in "${pkgs[@]}"; do
                debs=("$CACHE/debs/$p"_*.deb); deb=${debs[-1]}
                [ -f "$deb" ] || die "apt-get download left no $p .deb in $CACHE/debs"
                echo "$PROG: unpacking $deb" >&2
                dpkg-deb -x "$deb" "$dir.tmp" || die "dpkg-deb -x $deb failed"
                got+=("$deb")
            done
            deb=${got[*]}
            # Merged-/usr packages put the modules, and the image beside them, under
            # usr/lib/modules: move them where the runner looks.
            if [ ! -d "$dir.tmp/lib/modules/$kver" ] && [ -d "$dir.tmp/usr/lib/modules/$kver" ]; then
                mkdir -p "$dir.tmp/lib/modules" "$dir.tmp/boot"
                mv "$dir.tmp/usr/lib/modules/$kver" "$dir.tmp/lib/modules/$kver"
                if [ -f "$dir.tmp/lib/modules/$kver/vmlinuz" ] && [ ! -f "$dir.tmp/boot/vmlinuz-$kver" ]; then
                    mv "$dir.tmp/lib/modules/$kver/vmlinuz" "$dir.tmp/boot/vmlinuz-$kver"
                fi
            fi
            [ -f "$dir.tmp/boot/vmlinuz-$kver" ] || die "$deb has no boot/vmlinuz-$kver"
            [ -d "$dir.tmp/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
            # The package ships no modules.dep (its postinst runs depmod): make it here.
            depmod -b "$dir.tmp" "$kver" || die "depmod for $kver failed"
            rm -rf "$dir"; mv "$dir.tmp" "$dir"
            touch "$dir/.complete"
            rm -f "${got[@]}"   # the unpacked tree is all the runner needs
        fi
        # A refresh that found the same kernel starts its week again.
        [ "$s" != unstable ] || touch "$dir/.complete"
        ln -sfn "kernels/$kver" "$CACHE/$s"
    done
fi

for s in "${SERIES[@]}"; do
    complete "$s" || die "series $s is not available in $CACHE"
    dir=$(readlink -f "$CACHE/$s")
    echo "$s ${dir##*/} $dir"
done
