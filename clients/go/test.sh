#!/usr/bin/env bash
# Runs the Go client's tests (vectors, client logic, and a few against a
# real daemon when /tmp/tollgate-daemon or $TOLLGATE_DAEMON exists).
set -euo pipefail
# go needs a build cache; without HOME (some CI sandboxes) give it one
# outside the repository.
if [ -z "${GOCACHE:-}" ] && [ -z "${HOME:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ]; then
    export GOCACHE="${TMPDIR:-/tmp}/tollgate-go-cache-$(id -u)"
fi
cd "$(dirname "${BASH_SOURCE[0]}")"
go vet ./...
exec go test -count=1 ./...
