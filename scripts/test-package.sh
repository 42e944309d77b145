#!/usr/bin/env bash
# CI's package test: build the Debian package, install it on this machine
# with dpkg -i, verify the installed unit, run the packaged binary as the
# packaged user with the packaged config (a check and a report through it),
# remove it (the state stays), purge it (the state goes). Needs root for
# dpkg (sudo is used when not root). It refuses to run where a tollgate
# package is installed already, unless CI=true (a leftover of an earlier
# run, purged first).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi
step() { echo "== package test: $*" >&2; }
fail() {
    echo "package test FAILED: $*" >&2
    exit 1
}

if dpkg -s tollgate >/dev/null 2>&1; then
    [ "${CI:-}" = true ] || fail "a tollgate package is installed here already; not testing over it"
    "${as_root[@]}" dpkg -P tollgate >/dev/null
fi

step "build"
deb=$(bash scripts/build-deb.sh)
step "install $deb"
"${as_root[@]}" dpkg -i "$deb"
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then
        "${as_root[@]}" kill "$daemon_pid" 2>/dev/null || true
    fi
    "${as_root[@]}" dpkg -P tollgate >/dev/null 2>&1 || true
}
trap cleanup EXIT

step "what was installed"
for path in /usr/bin/tollgate /lib/systemd/system/tollgate.service /lib/systemd/system/tollgate.socket \
    /usr/lib/sysusers.d/tollgate.conf /usr/lib/tmpfiles.d/tollgate.conf /etc/tollgate/tollgate.toml \
    /usr/share/man/man1/tollgate.1.gz /usr/share/bash-completion/completions/tollgate \
    /usr/share/zsh/vendor-completions/_tollgate /usr/share/fish/vendor_completions.d/tollgate.fish \
    /usr/share/doc/tollgate/copyright; do
    [ -e "$path" ] || fail "$path is missing"
done
# (.debug_gdb_scripts is a loaded section, not debug information.)
if readelf -S -W /usr/bin/tollgate | grep -qE '\.debug_(info|line|str|abbrev)'; then
    fail "/usr/bin/tollgate carries debug sections"
fi
getent passwd tollgate >/dev/null || fail "no tollgate user"
[ "$(stat -c %U:%a /var/lib/tollgate)" = tollgate:700 ] || fail "/var/lib/tollgate is $(stat -c %U:%a /var/lib/tollgate)"
grep -q '^/etc/tollgate/tollgate.toml$' /var/lib/dpkg/info/tollgate.conffiles || fail "the config is not a conffile"
/usr/bin/tollgate check-config --config /etc/tollgate/tollgate.toml || fail "the packaged config is refused"
zcat /usr/share/man/man1/tollgate.1.gz | grep -q '^\.TH tollgate 1' || fail "the man page is not roff"

step "systemd-analyze verify"
# Checks the installed unit's syntax and that its commands exist; it needs
# no running systemd.
systemd-analyze verify /lib/systemd/system/tollgate.service /lib/systemd/system/tollgate.socket

step "the packaged binary, as the packaged user, with the packaged config"
# What the unit's RuntimeDirectory= would make.
"${as_root[@]}" install -d -o tollgate -g tollgate -m 0750 /run/tollgate
"${as_root[@]}" setpriv --reuid=tollgate --regid=tollgate --init-groups \
    /usr/bin/tollgate serve --config /etc/tollgate/tollgate.toml 2>/tmp/tollgate-package-test.log &
daemon_pid=$!
for _ in $(seq 100); do
    [ -S /run/tollgate/tollgate.sock ] && break
    sleep 0.1
done
[ -S /run/tollgate/tollgate.sock ] || fail "the daemon did not listen: $(cat /tmp/tollgate-package-test.log)"
[ "$(ps -o user= -p "$daemon_pid" | tr -d ' ')" = tollgate ] || fail "the daemon does not run as tollgate"
"${as_root[@]}" tollgate check --route login --ip 198.51.100.7 --account package-test ||
    fail "the check was not allowed (exit $?)"
"${as_root[@]}" tollgate report --route login --ip 198.51.100.7 --account package-test --outcome failure ||
    fail "the report failed (exit $?)"
"${as_root[@]}" tollgate status | grep -q 'tollgate' || fail "status printed nothing"
"${as_root[@]}" kill "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""
"${as_root[@]}" test -f /var/lib/tollgate/state.redb || fail "no state file in /var/lib/tollgate"
"${as_root[@]}" test -f /var/lib/tollgate/secret || fail "no secret in /var/lib/tollgate"

step "dpkg -r keeps the state and the config"
"${as_root[@]}" dpkg -r tollgate
[ ! -e /usr/bin/tollgate ] || fail "/usr/bin/tollgate is still there"
"${as_root[@]}" test -f /var/lib/tollgate/state.redb || fail "removing the package deleted the state"
[ -f /etc/tollgate/tollgate.toml ] || fail "removing the package deleted the config"

step "dpkg -P deletes them"
"${as_root[@]}" dpkg -P tollgate
[ ! -e /var/lib/tollgate ] || fail "purging left /var/lib/tollgate"
[ ! -e /etc/tollgate/tollgate.toml ] || fail "purging left the config"
step "ok"
