#!/bin/sh
# The Node.js client's own tests (node:test). The live-daemon tests use
# $TOLLGATE_DAEMON (default /tmp/tollgate-daemon) and are skipped without it.
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
cd "$here"
exec node --test test/*.test.mjs
