#!/usr/bin/env bash
# Compiles the Java client and its tests into a temporary directory outside
# the repository and runs them; exits non-zero when any check fails.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-java-test.XXXXXX")
trap 'rm -rf "$build"' EXIT
javac -encoding UTF-8 -d "$build" $(find "$here/src/main/java" "$here/src/test/java" "$here/example" -name '*.java')
java -cp "$build" dev.tollgate.client.AllTests "$root"
