#!/usr/bin/env bash
# The weapon budget: what each way a stranger can make a real user's login
# harder costs the attacker, and what the user then sees, on an unknown and
# a known device. Every figure comes from a fresh real daemon on the manual
# clock (examples/weapon_budget.rs), so the run takes about a minute.
#
#   bash benches/weapon-budget.sh
#   WEAPON_ENTRIES_MAX=6400 bash benches/weapon-budget.sh   # the full-map way's scaled cap
#
# Prints one Markdown table. TOLLGATE_BIN picks the daemon (default: this
# tree's release build, built first).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$here/target}
cd "$here"
cargo build --release --quiet --bin tollgate --example weapon_budget
TOLLGATE_BIN=${TOLLGATE_BIN:-$target/release/tollgate} "$target/release/examples/weapon_budget"
