#!/usr/bin/env bash
# The shared-store tests (issue 14) against Valkey instead of Redis.
#
#   bash scripts/test-valkey.sh [cargo test arguments]
#
# Debian 12 packages no Valkey, so this fetches Valkey's source from
# Debian's archive (trixie's 8.1.1, checked against its SHA-256), builds
# it once under target/valkey (with TLS, for the TLS tests), and runs
# every tests/shared_*.rs with valkey-server and valkey-cli first in PATH
# under the names the tests start (redis-server, redis-cli). Needs the
# network once, for the download; the tests themselves stay on loopback.
# Not part of scripts/test.sh: CI has no Valkey package to install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION=${VALKEY_VERSION:-8.1.1}
URL=${VALKEY_URL:-http://deb.debian.org/debian/pool/main/v/valkey/valkey_${VERSION}+dfsg1.orig.tar.xz}
SHA256=${VALKEY_SHA256:-d9bbd82eecb82f359e649a0007ad3dc1b47cc15afa626348ca86b73c4ae2c7ee}
DIR=$PWD/target/valkey
SRC=$DIR/valkey-$VERSION
# What the build in SRC was made from, written once it finished: a build
# from another source, or one that stopped midway, is made again.
STAMP="$URL $SHA256 MALLOC=libc BUILD_TLS=yes"

if [ "$(cat "$DIR/built" 2>/dev/null)" != "$STAMP" ]; then
    rm -f "$DIR/built"
    # A C compiler, make and OpenSSL's headers build it.
    missing=()
    command -v make >/dev/null || missing+=(make)
    command -v cc >/dev/null || missing+=(gcc)
    [ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
    command -v curl >/dev/null || missing+=(curl)
    command -v xz >/dev/null || missing+=(xz-utils)
    if [ "${#missing[@]}" -gt 0 ]; then
        as_root=()
        if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then as_root=(sudo); fi
        "${as_root[@]}" apt-get update -qq
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    mkdir -p "$DIR"
    curl -fsSL -o "$DIR/valkey.tar.xz" "$URL" || {
        echo "test-valkey.sh: could not download $URL (the one step that needs the network;" \
            "VALKEY_URL and VALKEY_SHA256 name another copy)" >&2
        exit 1
    }
    echo "$SHA256  $DIR/valkey.tar.xz" | sha256sum -c --quiet - || {
        echo "test-valkey.sh: $URL does not have SHA-256 $SHA256" >&2
        exit 1
    }
    rm -rf "$SRC"
    tar -C "$DIR" -xJf "$DIR/valkey.tar.xz"
    # The C library's allocator: the bundled jemalloc adds build time and
    # nothing the tests look at.
    # GIT_DIR: Valkey stamps its version with the git commit it finds, and
    # the one around target/ is tollgate's.
    GIT_DIR=/dev/null make -C "$SRC" -j"$(nproc)" MALLOC=libc BUILD_TLS=yes > "$DIR/build.log" 2>&1 || {
        tail -n 30 "$DIR/build.log" >&2
        echo "test-valkey.sh: Valkey did not build; the whole log is $DIR/build.log" >&2
        exit 1
    }
    echo "$STAMP" > "$DIR/built"
fi

mkdir -p "$DIR/bin"
ln -sf "$SRC/src/valkey-server" "$DIR/bin/redis-server"
ln -sf "$SRC/src/valkey-cli" "$DIR/bin/redis-cli"
export PATH=$DIR/bin:$PATH
# Read whole, not piped into `grep -q`: under pipefail a grep that stops
# reading early can fail the check for a server that passed it.
version=$(redis-server --version)
[[ $version == "Valkey server v=$VERSION "* ]] || {
    echo "test-valkey.sh: redis-server in PATH is not Valkey $VERSION: $version" >&2
    exit 1
}
echo "$version"
# Every test file that starts a store: tests/shared_*.rs.
tests=()
for file in tests/shared_*.rs; do
    name=${file#tests/}
    tests+=(--test "${name%.rs}")
done
exec cargo test --release "${tests[@]}" "$@"
