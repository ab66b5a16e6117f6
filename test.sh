#!/usr/bin/env bash
# The test command: sets up what the tests need, then runs them.
#
# Usage:
#   ./test.sh                     all tests: go test -race -count=1 ./...
#   ./test.sh -run X ./api/       extra arguments go to go test
#   ./test.sh --setup-only        set up only, run no test (CI's first step)
#   ./test.sh --help              this text
#
# Setup, every time (a no-op when all is there):
#  1. PostgreSQL (initdb and pg_ctl on PATH or in /usr/lib/postgresql/*/bin)
#     and redis-server must be installed; without them it stops with the
#     install line.
#  2. The Debian packages the tests drive: pgbouncer, prometheus (promtool),
#     chromium, python3-psycopg (importable by /usr/bin/python3), nodejs and
#     npm. Missing ones are installed when run as root (apt-get update once,
#     then apt-get install, non-interactive); otherwise it prints the
#     `sudo apt-get install ...` line and exits non-zero.
#  3. The pinned Node.js tools of tools/node: `npm ci` when
#     tools/node/node_modules is missing or older than package-lock.json.
#
# Arguments (all but --setup-only/--help) are passed to go test after
# -race -count=1 (a later -count=N wins). Package rule: when no argument
# names a package (`.`, or one starting with `./` or `../`), ./... is added
# before them; when one does, only the packages given are tested.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"
export DEBIAN_FRONTEND=noninteractive

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# missing_packages prints the Debian packages whose tools are absent, one a
# line. Each check is the one the tests make (internal/testenv, ui, deploy).
missing_packages() {
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || echo pgbouncer
  command -v promtool >/dev/null || echo prometheus
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
    command -v google-chrome >/dev/null || command -v google-chrome-stable >/dev/null || echo chromium
  /usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1 || echo python3-psycopg
  command -v node >/dev/null || echo nodejs
  command -v npm >/dev/null || echo npm
}

# check_servers stops with the install line when PostgreSQL or redis-server
# is missing (every test package needs them).
check_servers() {
  local absent=()
  if ! { command -v initdb >/dev/null && command -v pg_ctl >/dev/null; } &&
    ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    absent+=(postgresql)
  fi
  command -v redis-server >/dev/null || absent+=(redis-server)
  if [ ${#absent[@]} -gt 0 ]; then
    echo "test.sh: the tests start throwaway servers from ${absent[*]}, which is not installed:" >&2
    echo "  sudo apt-get install ${absent[*]}" >&2
    exit 1
  fi
}

install_packages() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  missing=${missing% }
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: the tests need Debian packages that are not installed; install them with:" >&2
    echo "  sudo apt-get install -y $missing" >&2
    exit 1
  fi
  echo "test.sh: installing $missing"
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  apt-get install -y -qq $missing >/dev/null
  missing=$(missing_packages | tr '\n' ' ')
  if [ -n "$missing" ]; then
    echo "test.sh: still missing after apt-get install: $missing" >&2
    exit 1
  fi
}

install_node_tools() {
  local dir=tools/node
  if [ ! -d "$dir/node_modules" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; then
    echo "test.sh: npm ci --prefix $dir"
    npm ci --prefix "$dir" --no-audit --no-fund
    # npm ci may leave the directory's time as it was: mark it current.
    touch "$dir/node_modules"
  fi
}

setup_only=false
args=()
for a in "$@"; do
  case "$a" in
  --setup-only) setup_only=true ;;
  -h | --help) usage; exit 0 ;;
  *) args+=("$a") ;;
  esac
done

check_servers
install_packages
install_node_tools
$setup_only && exit 0

packages=(./...)
for a in ${args[@]+"${args[@]}"}; do
  case "$a" in
  . | ./* | ../*) packages=() ;;
  esac
done
exec go test -race -count=1 ${packages[@]+"${packages[@]}"} ${args[@]+"${args[@]}"}
