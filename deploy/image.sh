#!/usr/bin/env bash
# Builds the Baton node image without any image registry: a FROM scratch image holding the given
# `baton` binary and exactly the shared libraries it loads.
#
#   deploy/image.sh BINARY [TAG]        (TAG defaults to $BATON_IMAGE, else baton:local)
#
# The build context is assembled in a temporary directory: `rootfs/` gets the binary at
# /usr/local/bin/baton and every library `ldd` resolves for it — the dynamic loader included —
# at the path the loader will look for it; `data/` becomes the node's data directory. Symlinks
# are followed, so the image holds the files themselves. The binary's debug info is stripped when
# `strip` is installed. A statically linked binary gets no
# libraries at all. A binary linked against glibc older than 2.34 is refused (its name lookups
# would need NSS modules the image lacks). Used by up.sh and by the cluster tests
# (cluster-test/src/docker.rs).
set -euo pipefail
# COPY keeps the context's modes, everything owned by root: under a strict umask (027) the binary
# and libraries would be unreadable to the node's own user (uid 10001), which could not start.
umask 022

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 BINARY [TAG]" >&2
    exit 2
fi
binary=$1
tag=${2:-${BATON_IMAGE:-baton:local}}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ ! -x $binary ]]; then
    echo "image.sh: $binary is not an executable file" >&2
    exit 1
fi
command -v docker >/dev/null || { echo "image.sh: docker is not installed" >&2; exit 1; }

context=$(mktemp -d "${TMPDIR:-/tmp}/baton-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/rootfs/usr/local/bin" "$context/data"
cp "$binary" "$context/rootfs/usr/local/bin/baton"
# Debug info is most of the file (80 MB -> 20 MB for a release build); the symbol table stays, so
# a panic's backtrace still names its functions.
if command -v strip >/dev/null; then
    strip --strip-debug "$context/rootfs/usr/local/bin/baton"
fi
cp "$here/Dockerfile" "$context/Dockerfile"

# `ldd` prints `name => /path (addr)` for libraries, `/path (addr)` for the loader, and no path
# for the vDSO; "not found" means the binary would not start in the image either.
if ldd_output=$(ldd "$binary" 2>&1); then
    if grep -q "not found" <<<"$ldd_output"; then
        echo "image.sh: $binary needs libraries this machine lacks:" >&2
        echo "$ldd_output" >&2
        exit 1
    fi
    libraries=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_output")
else
    # `ldd` fails on a static executable ("not a dynamic executable"): nothing to copy.
    libraries=""
fi
# Before glibc 2.34, host and DNS lookups load libnss_files/libnss_dns at run time (ldd does not
# list them), so in this image the nodes could not resolve their peers' names. The libc copied
# is this machine's, so its version is the one that counts.
if grep -q '/libc\.so\.6$' <<<"$libraries"; then
    glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>/dev/null | head -n 1 || true)
    if [[ $glibc =~ ([0-9]+)\.([0-9]+)[^0-9]*$ ]] &&
        ((10#${BASH_REMATCH[1]} * 1000 + 10#${BASH_REMATCH[2]} < 2034)); then
        echo "image.sh: this machine's glibc is ${BASH_REMATCH[1]}.${BASH_REMATCH[2]}; the image needs 2.34" \
            "or later, which resolves host names without NSS modules (older ones load" \
            "libnss_files/libnss_dns at run time, which the image would lack). Build the binary" \
            "and the image on a machine, or in a container, with glibc 2.34 or later" \
            "(Debian 12, Ubuntu 22.04, RHEL 9)." >&2
        exit 1
    fi
fi
for library in $libraries; do
    mkdir -p "$context/rootfs$(dirname "$library")"
    cp -L "$library" "$context/rootfs$library"
done

echo "image.sh: building $tag from $binary with $(wc -w <<<"$libraries") libraries:" $libraries
docker build --quiet --tag "$tag" "$context" >/dev/null
echo "image.sh: built $tag"
