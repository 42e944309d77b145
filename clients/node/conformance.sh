#!/bin/sh
# The conformance runner (docs/clients.md, "The conformance kit"). Plain
# JavaScript with no dependencies: nothing to build.
set -e
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
exec node "$here/conformance.mjs"
