#!/usr/bin/env bash
# Builds the Debian package from this tree: prints the path of
# target/debian/tollgate_<version>_<arch>.deb. Needs Rust from rustup (the
# crate's rust-version, 1.88, or newer), dpkg-deb and binutils' strip; no
# root. Installing it: `sudo apt install ./target/debian/tollgate_*.deb`.
#
# Hand-made with dpkg-deb rather than cargo-deb: the package is a dozen
# files and four maintainer scripts, all in this file, and the build needs
# nothing the test command does not already install.
#
# The unit keeps StateDirectory= and RuntimeDirectory= (systemd makes
# /var/lib/tollgate and /run/tollgate, owned by the unit's user, on start);
# the user itself is a static system user from sysusers.d rather than
# DynamicUser=, because the state file must keep one owner across
# restarts and upgrades, and admins name it in `server.admin_users`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
arch=$(dpkg --print-architecture)
target=${CARGO_TARGET_DIR:-target}
# PGO=1: the profile-guided build (scripts/build-pgo.sh): about 15% less
# daemon CPU a login (docs/performance.md), two release builds more.
if [ -n "${PGO:-}" ]; then
    binary=$(bash scripts/build-pgo.sh)
else
    cargo build --release --locked --bin tollgate >&2
    binary="$target/release/tollgate"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/tollgate_${version}_${arch}"
doc="$root/usr/share/doc/tollgate"

# The release profile keeps line tables for profiling; the package does not.
install -D -m 0755 "$binary" "$root/usr/bin/tollgate"
strip --strip-all "$root/usr/bin/tollgate"
# /lib, not /usr/lib: where Debian 12's deb-systemd-helper looks for units
# (on a merged /usr both are one).
install -D -m 0644 systemd/tollgate.service "$root/lib/systemd/system/tollgate.service"
install -D -m 0644 systemd/tollgate.socket "$root/lib/systemd/system/tollgate.socket"
install -D -m 0644 systemd/tollgate.sysusers "$root/usr/lib/sysusers.d/tollgate.conf"
install -D -m 0644 systemd/tollgate.tmpfiles "$root/usr/lib/tmpfiles.d/tollgate.conf"
install -d -m 0755 "$root/usr/share/man/man1" "$doc" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
    "$root/usr/share/fish/vendor_completions.d" "$root/etc/tollgate" "$root/DEBIAN"
"$binary" man | gzip -9n > "$root/usr/share/man/man1/tollgate.1.gz"
"$binary" completions bash > "$root/usr/share/bash-completion/completions/tollgate"
"$binary" completions zsh > "$root/usr/share/zsh/vendor-completions/_tollgate"
"$binary" completions fish > "$root/usr/share/fish/vendor_completions.d/tollgate.fish"
gzip -9n < CHANGELOG.md > "$doc/changelog.gz"

# The conffile: docs/configuration.md's complete example (which a test
# holds to be valid), every line commented out, so the file changes nothing
# until the operator uncomments a key.
{
    echo "# tollgate configuration. Every line is commented out: the built-in"
    echo "# defaults apply. Uncomment and edit a key to change it; every key,"
    echo "# its default and its range: /usr/share/doc/tollgate or docs/configuration.md."
    echo "# Check a change with \`tollgate check-config\`; apply it with"
    echo "# \`systemctl reload tollgate\`."
    echo "#"
    sed -n '/^## A complete example/,$p' docs/configuration.md |
        sed -n '/^```toml$/,/^```$/p' | sed '1d;$d' | sed 's/^\(.\)/# \1/'
} > "$root/etc/tollgate/tollgate.toml"
chmod 0644 "$root/etc/tollgate/tollgate.toml"
echo "/etc/tollgate/tollgate.toml" > "$root/DEBIAN/conffiles"

cat > "$doc/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tollgate
Source: the tollgate repository

Files: *
Copyright: the tollgate authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF

installed_kib=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: tollgate
Version: $version
Architecture: $arch
Maintainer: tollgate maintainers <tollgate@localhost>
Installed-Size: $installed_kib
Depends: libc6, adduser | systemd
Section: admin
Priority: optional
Description: per-host login rate limiter with durable lockouts
 tollgate answers check and report questions from an auth server over a
 Unix socket in microseconds: GCRA rate limits and failure windows in
 memory, lockouts kept in a redb state file that survives crashes and
 restarts. The CLI (status, lockouts, unlock, top) is the same binary.
EOF

cat > "$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers tollgate.conf
    elif ! getent passwd tollgate >/dev/null; then
        adduser --system --group --home /var/lib/tollgate --no-create-home tollgate
    fi
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles --create tollgate.conf
    fi
    # What StateDirectory= makes on start, made now so that `tollgate serve`
    # run by hand as the tollgate user (no systemd) finds it.
    install -d -o tollgate -g tollgate -m 0700 /var/lib/tollgate
    if command -v deb-systemd-helper >/dev/null 2>&1; then
        deb-systemd-helper enable tollgate.service >/dev/null || true
    fi
    # Only where systemd runs (not in a container without it): a failed
    # start is reported, and does not fail the install.
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl restart tollgate.service || echo "tollgate: the service did not start; see: systemctl status tollgate" >&2
    fi
fi
EOF

cat > "$root/DEBIAN/prerm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl stop tollgate.service tollgate.socket || true
fi
EOF

# Removing keeps the state (the lockouts and the secret) and the config;
# purging deletes both, as Debian packages do. The system user stays
# (Debian does not delete users: files may still carry its uid).
cat > "$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
if [ "$1" = purge ]; then
    rm -rf /var/lib/tollgate /run/tollgate
    rmdir /etc/tollgate 2>/dev/null || true
    if command -v deb-systemd-helper >/dev/null 2>&1; then
        deb-systemd-helper purge tollgate.service >/dev/null || true
    fi
fi
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p "$target/debian"
deb="$target/debian/tollgate_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"
