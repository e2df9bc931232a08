#!/usr/bin/env bash
# The operator image's two bases, made from Debian packages when no container registry is reachable
# (docs/install.md, "Building without a registry"). Prints the two image names as Make variables:
#
#   BUILD_BASE=localhost/dispatch-base:<suite>-build-<key>    debootstrap minbase + python3.11-venv
#   RUNTIME_BASE=localhost/dispatch-base:<suite>-runtime-<key> only what python3.11 loads: the
#                                                              interpreter, its stdlib, the shared
#                                                              libraries they link, CA certificates,
#                                                              /etc/passwd with nonroot (65532);
#                                                              no shell, no apt, no dpkg
#
# Both have Debian's python3.11 at /usr/bin/python3.11, so the builder's virtual environment runs
# on the runtime base (the Dockerfile's own defaults, python:3.11-slim-bookworm for both stages,
# share /usr/local/bin/python3.11 instead); the runtime one is a distroless-style cut.
# The root filesystems are cached as tarballs in $DISPATCH_CACHE/image-base/<suite>-<key>/, keyed
# by the suite, the package list and this script, and imported into podman when the image is
# missing. The Debian mirror is read from the host's apt configuration each run, never written
# (debootstrap's sources.list is removed from the rootfs).
set -euo pipefail

SUITE="${IMAGE_BASE_SUITE:-bookworm}"
PYVER=3.11
PACKAGES="python${PYVER},python${PYVER}-venv,python3-distutils,ca-certificates"
CACHE="${DISPATCH_CACHE:-$HOME/.cache/dispatch}/image-base"
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)

here="$(cd "$(dirname "$0")" && pwd)"
# The debootstrap rootfs is keyed by suite and packages; the runtime cut of it also by this script.
key="$(echo "$SUITE $PACKAGES" | sha256sum | cut -c1-12)"
runtime_key="$( (echo "$key"; cat "$here/image-base.sh") | sha256sum | cut -c1-12)"
dir="$CACHE/$SUITE-$key"
build_tag="localhost/dispatch-base:$SUITE-build-$key"
runtime_tag="localhost/dispatch-base:$SUITE-runtime-$runtime_key"

log() { echo "image-base: $*" >&2; }

# The first Debian mirror the host's apt uses for SUITE (deb822 .sources or one-line .list).
host_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '
      /^[ \t]*$/ { if (uri != "" && ok && !done) { print uri; done = 1 } uri = ""; ok = 0; next }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
      END { if (uri != "" && ok && !done) print uri }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v suite="$SUITE" '$1 == "deb" { u = $2; if (u ~ /^\[/) u = $3; for (i = 2; i <= NF; i++) if ($i == suite) { print u; break } }' "$f"
  done
}

make_rootfs() {
  local mirror rootfs="$dir/rootfs"
  mirror="$(host_mirror | grep -v -- '-security' | head -n1)"
  if [ -z "$mirror" ]; then
    echo "image-base: no apt source for '$SUITE' in /etc/apt/sources.list{,.d/}; set IMAGE_BASE_SUITE" >&2
    exit 1
  fi
  command -v debootstrap >/dev/null || { echo "image-base: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  rm -rf "$rootfs"
  mkdir -p "$dir"
  log "debootstrap --variant=minbase $SUITE (the host's apt mirror), $PACKAGES"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" > "$dir/debootstrap.log" 2>&1 || {
    tail -n 20 "$dir/debootstrap.log" >&2
    exit 1
  }
  # Nothing of the host's mirror stays in the image; no package cache either.
  rm -f "$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
  tar -C "$rootfs" --numeric-owner -cf "$dir/build.tar" .
  rm -rf "$rootfs"
}

cut_runtime() {
  local rootfs="$dir/rootfs"
  rm -rf "$rootfs" && mkdir -p "$rootfs"
  tar -C "$rootfs" --numeric-owner -xf "$dir/build.tar"
  make_runtime "$rootfs" "$dir/runtime"
  rm -f "$dir"/runtime-*.tar
  tar -C "$dir/runtime" --numeric-owner -cf "$dir/runtime-$runtime_key.tar" .
  rm -rf "$rootfs" "$dir/runtime"
}

# Copy one path of the build rootfs (and, for a symlink, what it points to) into the runtime one.
copy_path() {
  local src="$1" out="$2" p="$3" real name
  real="$(cd "$src" && chroot . /usr/bin/readlink -f "$p")"
  (cd "$src" && cp -a --parents ".$real" "$out")
  name="$(cd "$src" && chroot . /usr/bin/readlink -f "$(dirname "$p")")/$(basename "$p")"
  if [ "$name" != "$real" ] && [ ! -e "$out$name" ]; then
    mkdir -p "$out$(dirname "$name")"
    ln -s "$real" "$out$name"
  fi
}

# What python3.11 needs and nothing else, in the layout of the build rootfs (merged /usr).
make_runtime() {
  local src="$1" out="$2" lib
  rm -rf "$out"
  mkdir -p "$out"/{etc,tmp,usr/bin,usr/lib,var}
  chmod 1777 "$out/tmp"
  for link in bin sbin lib lib64; do
    [ -L "$src/$link" ] && cp -a "$src/$link" "$out/$link"
  done
  # The interpreter and its standard library (byte-compiled by Debian's postinst: the image runs
  # with a read-only root, so nothing could be compiled at run time), less what a server never
  # imports: tests, Tk, IDLE, ensurepip's bundled wheels, lib2to3, distutils, the static
  # libpython, and the modules that would pull terminal, dbm or SQLite libraries in.
  cp -a "$src/usr/bin/python$PYVER" "$out/usr/bin/"
  ln -s "python$PYVER" "$out/usr/bin/python3"
  cp -a "$src/usr/lib/python$PYVER" "$out/usr/lib/"
  [ -d "$src/etc/python$PYVER" ] && cp -a "$src/etc/python$PYVER" "$out/etc/"
  (cd "$out/usr/lib/python$PYVER" && rm -rf test idlelib tkinter turtledemo ensurepip lib2to3 \
    pydoc_data turtle.py config-"$PYVER"-* __phello__ site-packages dist-packages distutils \
    curses dbm sqlite3 lib-dynload/_curses* lib-dynload/readline.* lib-dynload/_dbm.* \
    lib-dynload/_gdbm.* lib-dynload/nis.* lib-dynload/_sqlite3.*)
  mkdir -p "$out/usr/lib/python3/dist-packages"
  # The shared libraries the interpreter and its extension modules link (ldd in the build
  # rootfs); all of glibc's (wheels link librt, libdl, libpthread; NSS modules are loaded by
  # name); libgcc_s and libstdc++, which manylinux wheels (pydantic-core, aiohttp's deps) link.
  {
    (cd "$out" && ls usr/lib/python$PYVER/lib-dynload/*.so) | sed 's|^|/|' \
      | (cd "$src" && xargs chroot . /usr/bin/ldd "/usr/bin/python$PYVER" 2>/dev/null) \
      | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }'
    (cd "$src" && chroot . /usr/bin/dpkg -L libc6 libgcc-s1 libstdc++6) \
      | grep -E '/lib/[^/]+/[^/]+\.so(\.[0-9]+)*$' | grep -v -e gconv -e /audit/
  } | sort -u | while read -r lib; do
    [ -e "$src$(cd "$src" && chroot . /usr/bin/readlink -f "$lib")" ] || continue
    copy_path "$src" "$out" "$lib"
  done
  # TLS (CA bundle, openssl.cnf), name resolution, users.
  mkdir -p "$out/etc/ssl/certs"
  cp -a "$src/etc/ssl/openssl.cnf" "$out/etc/ssl/"
  cp -L "$src/etc/ssl/certs/ca-certificates.crt" "$out/etc/ssl/certs/"
  [ -e "$src/usr/lib/ssl" ] && cp -a "$src/usr/lib/ssl" "$out/usr/lib/"
  cp -L "$src/etc/os-release" "$out/etc/os-release"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$out/etc/nsswitch.conf"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$out/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$out/etc/group"
  mkdir -p "$out/home/nonroot" "$out/root"
  chown 65532:65532 "$out/home/nonroot"
  # Fail now, not at the first image build, when the interpreter cannot start or load TLS.
  chroot "$out" /usr/bin/python3 -c 'import ssl, asyncio, ctypes, json, zlib, lzma, bz2, uuid, decimal, hashlib'
}

import_image() {
  local tag="$1" tar="$2"
  shift 2
  local changes=() c
  for c in "$@"; do changes+=(--change "$c"); done
  "${PODMAN[@]}" import --quiet "${changes[@]}" "$tar" "$tag" > /dev/null
  log "imported $tag ($(du -h "$tar" | cut -f1) uncompressed)"
}

if ! "${PODMAN[@]}" image exists "$build_tag"; then
  [ -s "$dir/build.tar" ] || make_rootfs
  import_image "$build_tag" "$dir/build.tar" 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'ENV LANG=C.UTF-8' 'CMD ["/bin/bash"]'
fi
if ! "${PODMAN[@]}" image exists "$runtime_tag"; then
  [ -s "$dir/build.tar" ] || make_rootfs
  [ -s "$dir/runtime-$runtime_key.tar" ] || cut_runtime
  import_image "$runtime_tag" "$dir/runtime-$runtime_key.tar" 'ENV PATH=/usr/bin' 'ENV LANG=C.UTF-8' \
    'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' 'USER 65532:65532' 'ENTRYPOINT ["/usr/bin/python3"]'
fi
echo "BUILD_BASE=$build_tag"
echo "RUNTIME_BASE=$runtime_tag"
