#!/usr/bin/env bash
# Builds the client and this example into a temporary directory, then runs it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-java-example.XXXXXX")
trap 'rm -rf "$build"' EXIT
javac -encoding UTF-8 -d "$build" $(find "$here/../src/main/java" "$here" -name '*.java')
java -cp "$build" LoginServer "$@"
