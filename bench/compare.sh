#!/usr/bin/env bash
# Throughput of ingest-worker against River on the same machine and database.
#
# Builds `ingest-worker`, bench/river and bench/floor, then for each mode
# (preload, preload-published, continuous; see bench/README.md) runs
# `ingest-worker bench`, River's bench and the floor (the least work any
# durable PostgreSQL queue does per job) alternately, --runs times each, and
# prints the medians of jobs/s worked and their ratios (ingest-worker /
# River, ingest-worker / floor, River / floor). --no-river leaves River out.
# --handler webhook has both sides POST each job to an in-process HTTP sink
# instead of doing nothing. See bench/README.md.
#
# The database must be one for benchmarks only: before each run the script
# empties ingest-worker's tables (ingest_task, ingest_task_transition,
# outbox_row and the outbox log: outbox_event's), River empties river_job and
# the floor bench_floor_job.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bench/compare.sh [options]

  --jobs N            jobs (tasks) per run (default 200000)
  --handler H         noop (default) or webhook: POST each job to an in-process HTTP sink
  --payload-bytes N   a string of N bytes in each job's payload/args (default 0)
  --fail-rate F       fraction of jobs whose first attempt fails, retried once (default 0)
  --runs N            runs of each side per mode (default 3)
  --modes LIST        modes to run, comma-separated: preload, preload-published,
                      continuous (default all three)
  --river-settings S  bench (River's `river bench` tuning, default) or defaults
  --no-river          run ingest-worker and the floor only (River's column: -)
  --timeout D         bound of each run, a Go duration (default 10m)
  --database-url URL  default $INGEST_DATABASE_URL, else
                      postgres://postgres@127.0.0.1:5432/bench_cmp?sslmode=disable
                      (created if missing)
  --redis-url URL     default $INGEST_REDIS_URL, else redis://127.0.0.1:6379/0
EOF
}

jobs=200000 handler=noop payload=0 fail=0 runs=3 modes=preload,preload-published,continuous settings=bench timeout=10m river=1
db=${INGEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/bench_cmp?sslmode=disable}
redis=${INGEST_REDIS_URL:-redis://127.0.0.1:6379/0}
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --handler) handler=$2; shift 2 ;;
    --payload-bytes) payload=$2; shift 2 ;;
    --fail-rate) fail=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --river-settings) settings=$2; shift 2 ;;
    --no-river) river=0; shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --database-url) db=$2; shift 2 ;;
    --redis-url) redis=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
for m in ${modes//,/ }; do
  case $m in preload|preload-published|continuous) ;; *) echo "compare.sh: unknown mode $m" >&2; exit 2 ;; esac
done
case $handler in noop|webhook) ;; *) echo "compare.sh: --handler must be noop or webhook, got $handler" >&2; exit 2 ;; esac
for tool in go psql; do
  command -v "$tool" >/dev/null || { echo "compare.sh: $tool is needed" >&2; exit 1; }
done

cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

# Create the database if it does not exist (through the server's "postgres"
# database).
if [[ $db =~ ^([^?]*/)([^/?]+)(\?.*)?$ ]]; then
  dbname=${BASH_REMATCH[2]}
  admin="${BASH_REMATCH[1]}postgres${BASH_REMATCH[3]}"
  if ! psql "$db" -qtAc 'SELECT 1' >/dev/null 2>&1; then
    echo "creating database $dbname"
    psql "$admin" -qc "CREATE DATABASE \"$dbname\"" >/dev/null
  fi
else
  echo "compare.sh: cannot find the database name in the database URL" >&2
  exit 2
fi

if [ "$river" = 1 ]; then echo "building ingest-worker, bench/river and bench/floor"; else echo "building ingest-worker and bench/floor"; fi
go build -o "$bin/ingest-worker" ./cmd/ingest-worker
go build -o "$bin/floor" ./bench/floor
if [ "$river" = 1 ]; then
  (cd bench/river && go build -o "$bin/riverbench" .)
fi

export INGEST_DATABASE_URL=$db INGEST_REDIS_URL=$redis
"$bin/ingest-worker" migrate >/dev/null

# A VACUUM and a checkpoint before each run, so that no run pays for the
# one before it: neither for its WAL nor for autovacuum cleaning up its
# table while the next run is timed (CHECKPOINT needs a superuser or
# pg_checkpoint; skipped otherwise).
checkpoint() {
  psql "$db" -qc 'VACUUM' >/dev/null 2>&1 || true
  psql "$db" -qc 'CHECKPOINT' >/dev/null 2>&1 || true
}

# field NAME FILE: the number of "NAME": in a JSON report.
field() { sed -n "s/^ *\"$1\": *\([0-9.eE+-]*\),\{0,1\}$/\1/p" "$2" | head -1; }

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

log=$bin/log
ingest_run() { # mode
  local preload=()
  [ "$1" = preload ] && preload=(--preload)
  [ "$1" = preload-published ] && preload=(--preload --publish-first)
  psql "$db" -qc 'TRUNCATE ingest_task, ingest_task_transition, outbox_row, outbox_log, outbox_log_batch, outbox_log_round' >/dev/null
  checkpoint
  "$bin/ingest-worker" bench "${preload[@]}" --tasks "$jobs" --handler "$handler" --payload-bytes "$payload" \
    --fail-rate "$fail" --timeout "$timeout" --json >"$bin/out.json" 2>"$log" ||
    { cat "$log" >&2; echo "compare.sh: ingest-worker bench failed" >&2; exit 1; }
  field tasks_per_second "$bin/out.json"
}
river_run() { # mode
  checkpoint
  "$bin/riverbench" --mode "${1%-published}" --jobs "$jobs" --handler "$handler" --payload-bytes "$payload" --fail-rate "$fail" \
    --settings "$settings" --timeout "$timeout" --database-url "$db" --json >"$bin/out.json" 2>"$log" ||
    { cat "$log" >&2; echo "compare.sh: River bench failed" >&2; exit 1; }
  field jobs_per_sec "$bin/out.json"
}

# The floor has two modes: a preload is a backlog of available rows, so
# preload-published is the same run as preload.
floor_run() { # mode
  checkpoint
  "$bin/floor" --mode "${1%-published}" --jobs "$jobs" --payload-bytes "$payload" \
    --timeout "$timeout" --database-url "$db" --json >"$bin/out.json" 2>"$log" ||
    { cat "$log" >&2; echo "compare.sh: floor failed" >&2; exit 1; }
  field jobs_per_sec "$bin/out.json"
}

# runs LIST: the runs, rounded, space-separated; ratio A B: A / B, or - when
# either is -.
runs_of() { printf '%.0f ' "$@" | sed 's/ $//'; }
ratio() { if [ "$1" = - ] || [ "$2" = - ]; then echo -; else awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; fi; }

ingest_desc= river_desc= floor_desc=
results=()
for mode in ${modes//,/ }; do
  ing=() riv=() flo=()
  for ((i = 1; i <= runs; i++)); do
    r=$(ingest_run "$mode"); ing+=("$r")
    [ -n "$ingest_desc" ] || ingest_desc=$(sed -n 's/^bench [0-9a-f]*: [0-9]* tasks, [a-z]* mode, //p' "$log")
    printf '%-17s run %d  ingest-worker %8.0f jobs/s\n' "$mode" "$i" "$r"
    if [ "$river" = 1 ]; then
      r=$(river_run "$mode"); riv+=("$r")
      [ -n "$river_desc" ] || river_desc=$(sed -n 's/^riverbench: \(River .*)\): [0-9]* jobs, [a-z]* mode\(.*\)/\1\2/p' "$log")
      printf '%-17s run %d  River         %8.0f jobs/s\n' "$mode" "$i" "$r"
    fi
    r=$(floor_run "$mode"); flo+=("$r")
    [ -n "$floor_desc" ] || floor_desc=$(sed -n 's/^floor: \(.*)\): [0-9]* jobs, [a-z]* mode$/\1/p' "$log")
    printf '%-17s run %d  floor         %8.0f jobs/s\n' "$mode" "$i" "$r"
  done
  mi=$(printf '%.0f' "$(median "${ing[@]}")") mf=$(printf '%.0f' "$(median "${flo[@]}")") mr=- rr=-
  if [ "$river" = 1 ]; then
    mr=$(printf '%.0f' "$(median "${riv[@]}")") rr=$(runs_of "${riv[@]}")
  fi
  results+=("$mode|$mi|$(runs_of "${ing[@]}")|$mr|$rr|$mf|$(runs_of "${flo[@]}")|$(ratio "$mi" "$mr")|$(ratio "$mi" "$mf")|$(ratio "$mr" "$mf")")
done

echo
echo "$jobs jobs per run, handler $handler, payload +$payload bytes, fail rate $fail, medians of $runs runs, $(nproc) cores"
echo "PostgreSQL $(psql "$db" -tAc 'SHOW server_version' | cut -d' ' -f1)"
echo "ingest-worker: $ingest_desc"
[ -z "$river_desc" ] || echo "$river_desc"
echo "floor: $floor_desc"
row='%-17s %21s  %-26s %12s  %-26s %12s  %-26s %12s %12s %12s\n'
# shellcheck disable=SC2059
printf "$row" mode "ingest-worker jobs/s" "(runs)" "River jobs/s" "(runs)" "floor jobs/s" "(runs)" ingest/River ingest/floor River/floor
for r in "${results[@]}"; do
  IFS='|' read -r m a ar b br f fr q qf rf <<<"$r"
  # shellcheck disable=SC2059
  printf "$row" "$m" "$a" "($ar)" "$b" "($br)" "$f" "($fr)" "$q" "$qf" "$rf"
done
