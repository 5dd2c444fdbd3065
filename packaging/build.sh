#!/usr/bin/env bash
# Builds the `allot` package for apt and dnf into target/packages/ (allot_*.deb,
# allot-*.rpm) with cargo-deb and cargo-generate-rpm from packaging/Cargo.toml's metadata.
#
#   packaging/build.sh           build both packages
#   packaging/build.sh --check   build, then: lintian (no errors), rpmlint (no errors),
#                                install the .deb here, `allot version`, reinstall
#                                (an upgrade keeps config edits and state),
#                                systemd-analyze verify on both installed units,
#                                remove (only configs and state stay), purge (nothing stays)
#
# Installs what it needs (cargo-deb, cargo-generate-rpm; lintian, rpmlint with apt).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[ "${1:-}" = "--check" ] && check=1

command -v cargo-deb >/dev/null || cargo install --locked -j2 cargo-deb
command -v cargo-generate-rpm >/dev/null || cargo install --locked -j2 cargo-generate-rpm

# allotd and the CLI apart from the agent, so that they are built without the
# agent's features (the checkpoint ladder's file watcher and HTTP client).
cargo build --profile dist -j2 -p allot-allocator -p allot-cli -p allot-sim
cargo build --profile dist -j2 -p allot-agent
# Man pages and completions, from each binary's own clap definition.
gen=target/allot-docs
rm -rf "$gen" && mkdir -p "$gen"
for b in allot allotd allot-agent allot-sim; do
  ALLOT_WRITE_DOCS="$gen" "target/dist/$b"
  gzip -9n "$gen/$b.1"
done
out=target/packages
rm -rf "$out" && mkdir -p "$out"
cargo deb -p allot-packaging --profile dist --no-build --output "$out/"
cargo generate-rpm -p packaging --profile dist --output "$out/"
ls -l "$out"
[ "$check" = 1 ] || exit 0

deb=$(ls "$out"/*.deb)
rpm=$(ls "$out"/*.rpm)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
if [ "$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then
  echo "packaging/build.sh: the checks install packages (apt, dpkg -i) and need root or passwordless sudo; SKIPPED" >&2
  exit 0
fi
if ! command -v lintian >/dev/null || ! command -v rpmlint >/dev/null; then
  if ! { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lintian rpmlint >/dev/null; }; then
    echo "packaging/build.sh: cannot install lintian and rpmlint (no package mirror?); checks SKIPPED" >&2
    exit 0
  fi
fi

echo "== lintian"
lintian --fail-on error --suppress-tags-from-file packaging/lintian-suppressed "$deb"
echo "== rpmlint"
rpmlint --rpmlintrc packaging/rpmlintrc "$rpm"

echo "== install"
as_root dpkg -i "$deb"
allot version
# Each binary's man page and completions, from its own clap definition.
for b in allot allotd allot-agent allot-sim; do
  zcat "/usr/share/man/man1/$b.1.gz" | grep -q "^\.TH $b 1" || { echo "no man page for $b"; exit 1; }
  grep -q "$b" "/usr/share/bash-completion/completions/$b" || { echo "no bash completion for $b"; exit 1; }
done
if command -v man >/dev/null; then man -w allot >/dev/null; fi
files=$(dpkg -L allot | while read -r f; do [ -f "$f" ] && echo "$f"; done)
echo "== systemd-analyze verify"
systemd-analyze verify /usr/lib/systemd/system/allot-agent.service /usr/lib/systemd/system/allotd.service
getent passwd allot >/dev/null || { echo "no allot user"; exit 1; }
[ -d /var/lib/allot/allotd ] || { echo "no state dir"; exit 1; }

echo "== upgrade keeps configs and state"
as_root sh -c 'echo "# edited by the operator" >> /etc/allot/agent.toml; touch /var/lib/allot/agent/keep-me'
as_root dpkg -i "$deb"
grep -q "edited by the operator" /etc/allot/agent.toml || { echo "upgrade lost the config edit"; exit 1; }
[ -e /var/lib/allot/agent/keep-me ] || { echo "upgrade lost state"; exit 1; }

echo "== remove: only configs and state stay"
as_root dpkg -r allot
left=0
for f in $files; do
  case "$f" in
    /etc/allot/*) [ -f "$f" ] || { echo "config $f removed by remove"; left=1; } ;;
    *) [ -e "$f" ] && { echo "left behind: $f"; left=1; } ;;
  esac
done
[ -d /var/lib/allot ] || { echo "state removed by remove"; left=1; }
[ "$left" = 0 ]

echo "== purge: nothing stays"
as_root dpkg -P allot
for p in /etc/allot /var/lib/allot; do
  [ -e "$p" ] && { echo "left behind after purge: $p"; exit 1; }
done
getent passwd allot >/dev/null && { echo "allot user left after purge"; exit 1; }
echo "packages ok: $deb $rpm"
