#!/usr/bin/env bash
# The README's test command. The shared-store tests start real
# redis-server processes and the conformance kit runs the Python, Go,
# Node.js and Java clients, so a fresh Debian machine gets the packages
# first; the tests themselves refuse to skip when one is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# openssl (the CLI) makes the TLS test's certificates.
missing=()
command -v redis-server >/dev/null && command -v redis-cli >/dev/null || missing+=(redis-server redis-tools)
command -v openssl >/dev/null || missing+=(openssl)
# promtool checks the shipped alerting rules (tests/alert_rules.rs).
command -v promtool >/dev/null || missing+=(prometheus)
# tmux is the terminal `tollgate top` is driven in (tests/top.rs).
command -v tmux >/dev/null || missing+=(tmux)
# The clients in other languages and their conformance kit
# (tests/client_conformance.rs): each client's own tests and runner.
command -v python3 >/dev/null || missing+=(python3)
command -v go >/dev/null || missing+=(golang-go)
command -v node >/dev/null || missing+=(nodejs)
command -v javac >/dev/null || missing+=(default-jdk-headless)
if [ "${#missing[@]}" -gt 0 ]; then
    # Root in containers and CI; sudo on a developer's machine.
    as_root=()
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then
        as_root=(sudo)
    fi
    # The package does not start a server in a container without an init;
    # the tests start their own on temp sockets and free ports.
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

exec cargo test --release "$@"
