#!/usr/bin/env bash
# Builds the Java client and its conformance runner into a cache outside the
# repository (keyed by the sources' checksum), then runs the runner on
# stdin/stdout (docs/clients.md, "The runner").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sources=$(find "$here/src/main/java" -name '*.java' | LC_ALL=C sort)
sum=$(cat $sources | sha256sum | cut -c1-16)
cache="${TMPDIR:-/tmp}/tollgate-java-client-$(id -u)/$sum"
if [ ! -f "$cache/.built" ]; then
    mkdir -p "$(dirname "$cache")"
    work=$(mktemp -d "$(dirname "$cache")/build.XXXXXX")
    javac -encoding UTF-8 -d "$work" $sources >&2
    touch "$work/.built"
    # Another run may have built the same sources meanwhile: either copy will do.
    mv -T "$work" "$cache" 2>/dev/null || rm -rf "$work"
fi
exec java -XX:+UseSerialGC -cp "$cache" dev.tollgate.client.conformance.Runner
