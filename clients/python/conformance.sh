#!/usr/bin/env bash
# Runs the conformance runner on stdin/stdout. Nothing to build: bytecode
# goes to a cache outside the repository, never next to the sources.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPYCACHEPREFIX="${XDG_CACHE_HOME:-${TMPDIR:-/tmp}}/tollgate-client-python-pycache"
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" "$here/conformance/runner.py"
