#!/usr/bin/env bash
# The client's own tests (stdlib unittest); exit 0 only when all pass.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPYCACHEPREFIX="${XDG_CACHE_HOME:-${TMPDIR:-/tmp}}/tollgate-client-python-pycache"
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m unittest discover -s "$here/tests" -t "$here/tests" "$@"
