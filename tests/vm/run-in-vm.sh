#!/bin/bash
# run-in-vm.sh KERNEL_DIR -- COMMAND [ARGS...]
#
# Boots the kernel unpacked in KERNEL_DIR (as fetch-kernels.sh leaves it: boot/vmlinuz-<release>
# and lib/modules/<release> with a modules.dep) under qemu and runs COMMAND in the guest as root,
# in the same working directory.  Nothing of the kernel has to be installed on the host.
#
# Guest userland: the host root shared read-only over 9p, made writable by an overlayfs with a
# tmpfs upper layer (guest writes are discarded).  The kernel's modules are bind-mounted at
# /lib/modules/<release>, so modprobe (and the kernel's module auto-loading) works in the guest.
# proc, sys, dev, devpts, bpffs, tracefs, debugfs, cgroup2 are mounted and lo is up.
# COMMAND's stdout and stderr arrive on this script's stdout and stderr (each on its own serial
# port), and its exit status is returned.
#
# Environment:
#   VM_MEM=2G  VM_CPUS=2  VM_TIMEOUT=600 (seconds; a hung guest becomes a failure, never a stuck run)
#   VM_RW="/dir1 /dir2"  host directories shared read-write at the same path (no spaces)
#   VM_ENV="VAR1 VAR2"   host variables passed to COMMAND (LANG, LC_ALL, RUST_LOG, RUST_BACKTRACE
#                        always are; PATH, HOME=/root are set)
#   VM_APPEND="..."      extra kernel command line
#   VM_VERBOSE=1         stream the guest console (kernel log) to stderr
#   VM_KEEP=1            keep the per-run directory (console.log, qemu.log)
#   VM_CONSOLE_KEEP=FILE when the run fails, copy the whole guest console there (the summary
#                        below shows only its end, where a hang's first report is long gone)
#   VM_LOCKUP_SECS=120   a guest CPU reported stuck this long (soft lockup) ends the run
#   VM_BOOT_SECS=300     a guest that has not started COMMAND this long after qemu did ends
#                        the run (a hang while booting; status 126)
#   VM_CACHE             where the unpacked vmlinux and initramfs per kernel are kept
#                        (default ${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/boot)
#   VM_QEMU=qemu-system-x86_64  VM_CPU=max
#   VM_TCG_THREAD=multi  multi: one host thread per vCPU; single: all vCPUs round-robin on
#                        one host thread (slower, but no vCPU can run a stale copy of code
#                        another vCPU just rewrote: the int3 deaths below need two threads)
#   VM_NIC=e1000e        an emulated NIC on a hub of its own (no traffic reaches it), for the
#                        tests of NIC hardware stamps: QEMU's e1000e has a PTP clock (frozen
#                        under TCG) and takes SIOCSHWTSTAMP, but stamps no packet. The guest
#                        has no udev: a test loads its driver (modprobe e1000e). "none": no NIC.
# Exit status: COMMAND's; 124 on timeout; 125 when the VM could not be set up or died; 126
# when the guest kernel died: an unhandled int3 at a code-patching site, or a panic while
# booting or while the command ran, or a CPU stuck in the kernel for VM_LOCKUP_SECS (see
# below).
#
# Acceleration is TCG (software emulation, ~10-30x slower guest code): the nested /dev/kvm of
# the development hosts cannot run an unmodified kernel.  Boot takes ~3 s because the bzImage's
# payload is unpacked once to an ELF vmlinux that qemu starts through its PVH entry point,
# skipping the in-guest decompressor.

set -u
PROG=${0##*/}
die() { echo "$PROG: $*" >&2; exit 125; }

[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: $PROG KERNEL_DIR -- COMMAND [ARGS...]"
KDIR=$(readlink -f "$1") || die "kernel directory '$1' not found"
shift 2
[ -d "$KDIR/lib/modules" ] || die "$KDIR/lib/modules missing (not a kernel unpacked by fetch-kernels.sh?)"
kvers=("$KDIR"/lib/modules/*/modules.dep)
[ ${#kvers[@]} = 1 ] && [ -f "${kvers[0]}" ] || die "$KDIR must hold exactly one lib/modules/<release> with modules.dep"
kver=$(basename "$(dirname "${kvers[0]}")")
MODDIR=$KDIR/lib/modules/$kver
KERNEL=$KDIR/boot/vmlinuz-$kver
[ -r "$KERNEL" ] || die "$KERNEL missing"

QEMU=${VM_QEMU:-qemu-system-x86_64}
case ${VM_TCG_THREAD:-multi} in multi|single) ;; *) die "VM_TCG_THREAD='$VM_TCG_THREAD': multi or single" ;; esac
command -v "$QEMU" >/dev/null || die "$QEMU not found (apt-get install qemu-system-x86)"
for t in cpio gzip timeout mkfifo modprobe readelf xz zstd; do
    command -v $t >/dev/null || die "$t not found"
done
BUSYBOX=$(command -v busybox) || die "busybox not found (apt-get install busybox-static)"
readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'program interpreter' &&
    die "$BUSYBOX is dynamically linked (apt-get install busybox-static)"

MEM=${VM_MEM:-2G}; CPUS=${VM_CPUS:-2}; TMO=${VM_TIMEOUT:-600}
CACHE=${VM_CACHE:-${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/boot}
mkdir -p "$CACHE" || die "cannot create $CACHE"
# Boot images are built once per kernel; a lock keeps concurrent runs from building them twice.
exec 8>"$CACHE/.lock-$kver"
flock 8

# ---- ELF vmlinux with a PVH entry, cut out of the bzImage (x86 boot protocol header fields)
le() { od -An -t"u$1" -j"$2" -N"$1" "$KERNEL" | tr -d ' '; }   # little-endian uint, size $1 at $2
[ "$(dd if="$KERNEL" bs=1 skip=514 count=4 2>/dev/null)" = HdrS ] || die "$KERNEL is not a bzImage"
VMLINUX=$CACHE/vmlinux-$kver
if [ ! -s "$VMLINUX" ] || [ "$VMLINUX" -ot "$KERNEL" ]; then
    setup_sects=$(le 1 497); payload_offset=$(le 4 584); payload_length=$(le 4 588)
    off=$(( (setup_sects + 1) * 512 + payload_offset )); len=$(( payload_length - 4 ))  # minus size trailer
    case $(od -An -tx1 -j"$off" -N4 "$KERNEL" | tr -d ' ') in
        fd377a58) dec="xz -dc" ;;  28b52ffd) dec="zstd -qdc" ;;  1f8b*) dec="gzip -dc" ;;  *) dec="" ;;
    esac
    rm -f "$VMLINUX"
    if [ -n "$dec" ]; then
        tail -c +$((off + 1)) "$KERNEL" | head -c "$len" | $dec > "$VMLINUX.tmp" 2>/dev/null &&
            readelf -n "$VMLINUX.tmp" 2>/dev/null | grep -q 'Xen.*(0x00000012)' &&  # XEN_ELFNOTE_PHYS32_ENTRY
            mv "$VMLINUX.tmp" "$VMLINUX"
        rm -f "$VMLINUX.tmp"
    fi
fi
BOOTIMG=$KERNEL
[ -s "$VMLINUX" ] && BOOTIMG=$VMLINUX   # else boot the bzImage as it is, ~3 s slower

# ---- initramfs: busybox plus the modules needed to reach the 9p/overlay root
INITRD=$CACHE/initramfs-$kver.cpio.gz
SELF=$(readlink -f "$0")
if [ ! -s "$INITRD" ] || [ "$INITRD" -ot "$SELF" ] || [ "$INITRD" -ot "$MODDIR/modules.dep" ]; then
    ird=$(mktemp -d "$CACHE/initramfs.XXXXXX") || die "mktemp failed"
    mkdir -p "$ird"/{bin,proc,sys,dev,mods,share,lower,upper,newroot}
    cp "$BUSYBOX" "$ird/bin/busybox"
    for a in sh mount mkdir insmod cat echo stty poweroff sync ip hostname chroot; do
        ln -s busybox "$ird/bin/$a"
    done
    : > "$ird/mods/order"
    for m in virtio_pci 9pnet_virtio 9p overlay; do
        modprobe -d "$KDIR" -S "$kver" --show-depends "$m" || echo "missing module $m" >&2
    done | awk '$1 == "insmod" && !seen[$2]++ {print $2}' | while read -r ko; do
        b=$(basename "$ko"); b=${b%.xz}; b=${b%.zst}; b=${b%.gz}
        case $ko in   # busybox insmod wants plain ELF objects
            *.xz) xz -dc "$ko" ;;  *.zst) zstd -qdc "$ko" ;;  *.gz) gzip -dc "$ko" ;;  *) cat "$ko" ;;
        esac > "$ird/mods/$b" || { echo "cannot unpack $ko" >&2; exit 1; }
        echo "$b" >> "$ird/mods/order"
    done || { rm -rf "$ird"; die "module unpacking failed"; }
    cat > "$ird/init" <<'INIT'
#!/bin/sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
fail() { echo "vm-init: $*" > /dev/ttyS0; echo "vm-init: $*" > /dev/ttyS2; poweroff -f; }
for m in $(cat /mods/order); do insmod /mods/$m || fail "insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none vmrun /share || fail "cannot mount the run share"
. /share/guest.conf
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot /lower || fail "cannot mount the host root"
mount -t tmpfs -o mode=755 tmpfs /upper && mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot || fail "overlayfs failed"
R=/newroot
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm; mount -t devpts -o newinstance,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm; mount -t tmpfs tmpfs $R/run
mount -t bpf bpf $R/sys/fs/bpf; mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t debugfs debugfs $R/sys/kernel/debug; mount -t securityfs securityfs $R/sys/kernel/security
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
mkdir -p "$R/lib/modules/$KVER" && mount --bind "$R$KMODDIR" "$R/lib/modules/$KVER" || fail "cannot place the modules"
mkdir -p "$R$RUNDIR" && mount --move /share "$R$RUNDIR" || fail "cannot place the run share at $RUNDIR"
i=0
for d in $RWDIRS; do
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none rw$i "$R$d" || fail "cannot mount rw share $d"
    i=$((i+1))
done
echo /bin/modprobe-guest > /proc/sys/kernel/modprobe
hostname vm; ip link set lo up
stty -F /dev/ttyS1 raw -echo; stty -F /dev/ttyS2 raw -echo   # else \n turns into \r\n
: > "$R$RUNDIR/started"   # the host tells a death during boot from one of the command's
chroot $R /bin/bash "$RUNDIR/cmd.sh" </dev/null >/dev/ttyS1 2>/dev/ttyS2
echo $? > "$R$RUNDIR/rc"
sync
poweroff -f
INIT
    # The kernel runs its module loader (e.g. for `ip link add type veth`) from init's root,
    # the initramfs, not from the chroot: hand it on to the guest root's modprobe.
    printf '#!/bin/sh\nexec /bin/chroot /newroot /sbin/modprobe "$@"\n' > "$ird/bin/modprobe-guest"
    chmod 755 "$ird/init" "$ird/bin/modprobe-guest"
    (cd "$ird" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$INITRD.tmp") &&
        mv "$INITRD.tmp" "$INITRD" || { rm -rf "$ird"; die "initramfs build failed"; }
    rm -rf "$ird"
fi
exec 8>&-

# ---- per-run directory: fifos and logs on the host, share/ seen by the guest
RUN=$(mktemp -d "${TMPDIR:-/tmp}/tailtrap-vmrun.XXXXXX") || die "mktemp failed"
SHARE=$RUN/share; mkdir "$SHARE"
readers=(); qpid=""
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    # timeout runs qemu in a process group of its own, out of reach of signals to ours:
    # stop it here (timeout passes the signal on to qemu) when this script is interrupted.
    [ -n "$qpid" ] && kill "$qpid" 2>/dev/null
    for p in "${readers[@]}"; do kill "$p" 2>/dev/null; done
    if [ "${VM_KEEP:-0}" = 1 ]; then echo "$PROG: run directory kept: $RUN" >&2; else rm -rf "$RUN"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nicargs=()
case ${VM_NIC:-e1000e} in
    none) ;;
    *[!a-z0-9-]*) die "VM_NIC=${VM_NIC} is not a qemu device name" ;;
    *) nicargs=(-netdev hubport,id=nic0,hubid=0 -device "${VM_NIC:-e1000e},netdev=nic0") ;;
esac
RWDIRS=""; rwargs=(); i=0
for d in ${VM_RW:-}; do
    d=$(readlink -f "$d"); [ -d "$d" ] || die "VM_RW: $d is not a directory"
    RWDIRS="$RWDIRS $d"
    rwargs+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none,multidevs=remap")
    i=$((i+1))
done
printf 'RUNDIR=%q\nRWDIRS=%q\nKVER=%q\nKMODDIR=%q\n' "$SHARE" "$RWDIRS" "$kver" "$MODDIR" > "$SHARE/guest.conf"
{
    echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    echo 'export HOME=/root USER=root LOGNAME=root TERM=dumb LANG=C.UTF-8'
    for v in LANG LC_ALL RUST_LOG RUST_BACKTRACE ${VM_ENV:-}; do
        [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
    done
    printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
    # Hold RX software timestamping's static key for the guest's life (a socket asking for
    # stamps), so that loading and unloading the probes only change its count: switching a
    # static key rewrites kernel text with a temporary int3, and under multi-threaded TCG
    # another vCPU can run a stale copy of that int3 after the rewrite ended, an oops no
    # real CPU shows. Tracepoints are not held: attaching a program to one also rewrites
    # its static call, and enabling trace events at boot died the same way.
    # shellcheck disable=SC2016 # expanded in the guest
    printf '%s\n' \
        'if command -v python3 >/dev/null; then' \
        '  python3 -c "import socket,time; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET,socket.SO_TIMESTAMPNS,1); time.sleep(1e9)" </dev/null >/dev/null 2>&1 &' \
        'fi'
    printf 'exec'; printf ' %q' "$@"; echo
} > "$SHARE/cmd.sh"

for c in out err con; do mkfifo "$RUN/$c.in" "$RUN/$c.out" || die "mkfifo failed"; done
cat "$RUN/out.out" & readers+=($!)
cat "$RUN/err.out" >&2 & readers+=($!)
if [ "${VM_VERBOSE:-0}" = 1 ]; then
    tee "$RUN/console.log" < "$RUN/con.out" >&2 & readers+=($!)
else
    cat "$RUN/con.out" > "$RUN/console.log" & readers+=($!)
fi

# loglevel=5, not quiet: a lockup's or oops's stack and registers are printed at the
# default level (4), which quiet hides; the lockup in CI kept only its headline lines.
# oops=panic: an oops in process context (an int3 at a patched call site hit by a daemon's
# thread) only kills that task, and the test then waits for it until VM_TIMEOUT (a 5.10 run
# in CI held 30 minutes that way); as a panic the guest stops at once and is rerun.
timeout -k 10 "$TMO" "$QEMU" -accel "tcg,thread=${VM_TCG_THREAD:-multi}" -cpu "${VM_CPU:-max}" -m "$MEM" -smp "$CPUS" \
    -nodefaults -no-user-config -display none -vga none -no-reboot \
    -kernel "$BOOTIMG" -initrd "$INITRD" \
    -append "console=ttyS0 loglevel=5 oops=panic panic=-1 mitigations=off rdinit=/init ${VM_APPEND:-}" \
    -chardev pipe,id=con,path="$RUN/con" -serial chardev:con \
    -chardev pipe,id=out,path="$RUN/out" -serial chardev:out \
    -chardev pipe,id=err,path="$RUN/err" -serial chardev:err \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$SHARE,mount_tag=vmrun,security_model=none" \
    "${rwargs[@]}" "${nicargs[@]}" \
    </dev/null >"$RUN/qemu.log" 2>&1 &
qpid=$!
# A guest CPU stuck in the kernel never comes back: the watchdog repeats its report until
# the timeout, 30 minutes later. Stop once one CPU has been reported stuck for
# VM_LOCKUP_SECS instead (shorter reports come and go when the host is overloaded). Newer
# kernels report a growing time ("stuck for 130s"); 5.10 starts again at about 22 s with
# each report, so the span is counted from the first of a run of reports on that CPU (each
# within 90 s of the last) to the latest: a CI run's 5.10 guest spun at skb_consume_udp+0x0
# for the whole timeout that way, each report saying 22-23 s.
lockup_secs=${VM_LOCKUP_SECS:-120}
# Exit 0 when a CPU of the console log $1 has been stuck for $2 seconds.
stuck_long() {
    grep -oE '^\[ *[0-9.]+\] watchdog: BUG: soft lockup - CPU#[0-9]+ stuck for [0-9]+s' "$1" 2>/dev/null |
        sed -E 's/^\[ *([0-9.]+)\].*CPU#([0-9]+) stuck for ([0-9]+)s$/\1 \2 \3/' |
        awk -v limit="$2" '{
            t = $1 + 0; cpu = $2; since = t - $3
            if (!(cpu in first) || t - last[cpu] > 90) first[cpu] = since
            last[cpu] = t
            if (t - first[cpu] >= limit) found = 1
        } END { exit !found }'
}
# A guest that has not started the command this long after qemu did hung while booting
# (seen once on 7.2 under emulation, the console silent after 2.3 s of boot): ended here,
# with a kernel death's status, instead of holding the whole timeout.
boot_secs=${VM_BOOT_SECS:-300}
booting_since=$SECONDS
( while kill -0 $qpid 2>/dev/null; do
      if [ ! -e "$SHARE/started" ] && [ $((SECONDS - booting_since)) -ge "$boot_secs" ]; then
          : > "$RUN/boothang"; kill $qpid 2>/dev/null; break
      fi
      if stuck_long "$RUN/console.log" "$lockup_secs"; then
          : > "$RUN/lockup"; kill $qpid 2>/dev/null; break
      fi
      sleep 5
  done ) & watcher=$!; readers+=($watcher)
# Waiting on a background qemu (instead of running it in the foreground) lets INT/TERM stop
# the VM at once through the trap above.
wait $qpid; qrc=$?; qpid=""
kill $watcher 2>/dev/null # asleep between looks: its job ended with qemu
# The readers end at EOF once qemu is gone; one whose fifo qemu never opened is killed.
for _ in $(seq 10); do
    alive=0; for p in "${readers[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.2
done

if [ -s "$SHARE/rc" ]; then
    exit "$(cat "$SHARE/rc")"
fi
first_report() { # pattern: the kernel's first report matching it, with its stack
    grep -m1 -A 40 -E "$1" "$RUN/console.log" | sed -n '1,/^\[ *[0-9.]*\] *<\/TASK>/p'
}
if [ -e "$RUN/boothang" ]; then
    echo "$PROG: the guest did not start the command within ${boot_secs}s of booting (kernel $kver): a hang while booting" >&2
    rc=126
elif [ -e "$RUN/lockup" ]; then
    # A CPU spinning in the kernel (a lock never released, a wait that never ends). Seen once
    # on 6.1 under emulation, in the UDP slow-reader test's traffic task, with the host
    # loaded by three soaks and a CI run; its first report was lost with the console, which
    # is why failed runs now keep it (VM_CONSOLE_KEEP). A BPF program cannot loop (the
    # verifier bounds it), so a lockup is a kernel bug whichever program is attached; it gets
    # the status of a kernel death, and its first report is printed whole.
    echo "$PROG: guest kernel hung: a CPU stuck in the kernel for over ${lockup_secs}s (kernel $kver); first report: $(grep -m1 -o 'soft lockup - CPU#[0-9]* stuck for [0-9]*s! \[[^]]*\]' "$RUN/console.log")" >&2
    echo "---- its first report:" >&2; first_report 'soft lockup|self-detected stall' >&2
    rc=126
elif [ $qrc = 124 ] || [ $qrc = 137 ]; then
    echo "$PROG: timed out after ${TMO}s (kernel $kver)" >&2; rc=124
    if grep -qE 'soft lockup|self-detected stall' "$RUN/console.log"; then
        echo "---- the guest kernel's first stall report:" >&2
        first_report 'soft lockup|self-detected stall' >&2
    fi
elif grep -q 'Oops: int3' "$RUN/console.log"; then
    # A breakpoint left at a call site the kernel was patching (a BPF trampoline attached or
    # detached) that its int3 handler no longer recognised: seen only in guests under
    # software emulation, with any set of fentry programs. Its own status, so the caller can
    # tell it from a crash of the code under test.
    echo "$PROG: guest kernel oops: int3 at a code-patching site (kernel $kver): $(grep -m1 -o 'RIP: 0010:[^ ]*' "$RUN/console.log")" >&2
    rc=126
elif grep -q 'Kernel panic' "$RUN/console.log"; then
    # The kernel died. Before the command existed: seen on 6.12 under emulation
    # (text_poke_early patching a static call). While it ran: seen once on 6.1 under
    # emulation with the real pwru's kprobes live on the receive path ("Fatal exception in
    # interrupt", RIP 0); kprobes patch text with int3 as trampolines do. tailtrap's own code
    # cannot take a kernel down short of a kernel bug, so either gets the same status as the
    # int3 death: the caller may run it again once, and says so.
    if [ -e "$SHARE/started" ]; then when="while the command ran"; else when="while booting, before the command ran"; fi
    echo "$PROG: guest kernel panicked $when (kernel $kver): $(grep -m1 -o 'Kernel panic.*' "$RUN/console.log") $(grep -m1 -o 'RIP: 0010:[^ ]*' "$RUN/console.log")" >&2
    rc=126
else
    echo "$PROG: the VM ended without the command's exit status (kernel $kver, qemu status $qrc)" >&2; rc=125
fi
echo "---- qemu log (last 20 lines):" >&2; tail -n 20 "$RUN/qemu.log" >&2
echo "---- guest console (last 40 lines):" >&2; tail -n 40 "$RUN/console.log" >&2
if [ -n "${VM_CONSOLE_KEEP:-}" ] && cp "$RUN/console.log" "$VM_CONSOLE_KEEP" 2>/dev/null; then
    echo "$PROG: the whole guest console: $VM_CONSOLE_KEEP" >&2
fi
exit $rc
