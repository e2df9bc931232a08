#!/usr/bin/env bash
# Build (once) a Debian chroot holding a newer Slurm than the host's, for the live Slurm tests:
#   trixie -> Slurm 24.11 (REST v0.0.40-42), sid -> Slurm 26.05 (REST v0.0.42-45).
# The newer suites need a newer libc than the Debian 12 host, hence a chroot; loopback is shared, so
# the tests talk to its slurmrestd on 127.0.0.1. tests/support/slurmlab.py starts the daemons inside.
#
# Usage (root): hack/slurm-chroot.sh SUITE [CACHE_DIR]
#   CACHE_DIR defaults to ${DISPATCH_CHROOT_CACHE:-$HOME/.cache/dispatch/chroot}; the chroot is
#   CACHE_DIR/SUITE and is complete only when CACHE_DIR/SUITE/.dispatch-ready exists (built in a
#   scratch directory and renamed, so an interrupted build never looks finished).
#
# The mirror is read from the host's own apt configuration at run time (no host name in any file);
# the chroot's sources.list exists only while its packages install. Nothing is mounted after this
# script ends: the lab mounts /proc, /sys and /dev in a private mount namespace per daemon.
set -euo pipefail
SUITE=${1:?usage: slurm-chroot.sh SUITE [CACHE_DIR]}
CACHE=${2:-${DISPATCH_CHROOT_CACHE:-$HOME/.cache/dispatch/chroot}}
ROOT=$CACHE/$SUITE
case "$SUITE" in trixie | sid) ;; *) echo "slurm-chroot.sh: SUITE must be trixie or sid, not '$SUITE'" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "slurm-chroot.sh: needs root (debootstrap, chroot)" >&2; exit 2; }
[ -e "$ROOT/.dispatch-ready" ] && { echo "slurm-chroot: $SUITE ready in $ROOT"; exit 0; }

say() { printf '[%(%H:%M:%S)T] slurm-chroot %s: %s\n' -1 "$SUITE" "$*"; }
mirror() { # the host's Debian mirror: first URIs: of its deb822 sources, else the first deb line
  local m
  m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$m" ] || { echo "slurm-chroot.sh: cannot find the host's Debian mirror in its apt sources" >&2; exit 1; }
  printf '%s' "$m"
}
# sid's Release file carries a Valid-Until that a snapshot mirror is past; trixie's has none.
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o DPkg::Lock::Timeout=600)

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on the host"
  apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 \
    || { apt-get "${APT_OPTS[@]}" update -qq; DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install -y -qq --no-install-recommends debootstrap; }
fi

mkdir -p "$CACHE"
# One build per suite at a time (two checkouts may run `make integration` at once); the second
# finds the first's chroot ready and never replaces a chroot a lab may be running from.
exec 9>"$CACHE/.$SUITE.lock"
flock 9
[ -e "$ROOT/.dispatch-ready" ] && { echo "slurm-chroot: $SUITE ready in $ROOT"; exit 0; }
WORK=$(mktemp -d "$CACHE/.$SUITE.build.XXXXXX")
LOG=$WORK.log
chmod 755 "$WORK" # mktemp makes it 0700: every user in the chroot (munge, _apt) must traverse /
cleanup() {
  for m in dev/pts dev sys proc; do mountpoint -q "$WORK/$m" 2>/dev/null && umount -l "$WORK/$m"; done
  [ -d "$WORK" ] && rm -rf --one-file-system "$WORK"
  rm -f "$LOG"
}
fail() { tail -40 "$LOG" >&2; cp "$LOG" "/tmp/slurm-chroot-$SUITE.log" 2>/dev/null && echo "full log: /tmp/slurm-chroot-$SUITE.log" >&2; exit 1; }
trap cleanup EXIT
t0=$SECONDS
M=$(mirror)
say "debootstrap --variant=minbase into $WORK"
debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
  "$SUITE" "$WORK" "$M" >"$LOG" 2>&1 || fail
t1=$SECONDS
say "debootstrap done in $((t1 - t0)) s"

mount -t proc proc "$WORK/proc"
mount -t sysfs sysfs "$WORK/sys"
mount --bind /dev "$WORK/dev"
mount --bind /dev/pts "$WORK/dev/pts"
cp -L /etc/resolv.conf "$WORK/etc/resolv.conf" 2>/dev/null || true
printf '#!/bin/sh\nexit 101\n' >"$WORK/usr/sbin/policy-rc.d" # no service starts by itself
chmod 755 "$WORK/usr/sbin/policy-rc.d"
printf 'deb %s %s main\n' "$M" "$SUITE" >"$WORK/etc/apt/sources.list"
in_root() { chroot "$WORK" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }
in_root apt-get -o Acquire::Check-Valid-Until=false update -qq >>"$LOG" 2>&1 || fail
in_root apt-get -o Acquire::Check-Valid-Until=false install -y -qq --no-install-recommends \
  slurmctld slurmd slurmrestd slurm-client munge slurm-wlm-jwt-plugin procps util-linux >>"$LOG" 2>&1 \
  || fail
in_root apt-get clean
rm -rf "$WORK/etc/apt/sources.list" "$WORK"/var/lib/apt/lists/*
for u in slurmrest dispatch; do in_root id "$u" >/dev/null 2>&1 || in_root useradd -r -M -s /usr/sbin/nologin "$u"; done
version=$(in_root dpkg-query -W -f '${Version}' slurmrestd)
for m in dev/pts dev sys proc; do umount "$WORK/$m"; done
printf '%s\n' "$version" >"$WORK/.dispatch-ready"
chmod 755 "$WORK"
rm -rf --one-file-system "$ROOT"
mv "$WORK" "$ROOT"
say "Slurm $version ready in $ROOT: debootstrap $((t1 - t0)) s, packages $((SECONDS - t1)) s, $(du -shx "$ROOT" | cut -f1)"
