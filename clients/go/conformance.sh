#!/usr/bin/env bash
# Builds the conformance runner outside the repository (go's build cache
# makes a rebuild quick), then runs it on this script's stdin and stdout.
set -euo pipefail
# go needs a build cache; without HOME (some CI sandboxes) give it one
# outside the repository.
if [ -z "${GOCACHE:-}" ] && [ -z "${HOME:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ]; then
    export GOCACHE="${TMPDIR:-/tmp}/tollgate-go-cache-$(id -u)"
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${TMPDIR:-/tmp}/tollgate-go-conformance-$(id -u)"
mkdir -p "$out"
# Built under a name of its own, then renamed: runners started together
# never exec a half-written binary.
(cd "$here" && go build -o "$out/runner.$$" ./cmd/tollgate-conformance) >&2
mv -f "$out/runner.$$" "$out/tollgate-conformance"
exec "$out/tollgate-conformance"
