#!/usr/bin/env bash
# The number game with its reward computed by two `rlstream reward-server` processes.
#
#   examples/number-game-remote/run.sh [embedded] [a.b.c=value …]
#       starts the reward servers, trains with all five stages in one process
#       (`rlstream train`), stops the servers.
#
#   KAFKA_BROKERS=host:9092[,host2:9092] DATABASE_URL=postgres://user@host:5432/db \
#   examples/number-game-remote/run.sh distributed [a.b.c=value …]
#       starts the reward servers, then each stage as its own `rlstream serve <stage>` process
#       over Kafka + PostgreSQL — with TWO reward replicas, replica i preferring server i (one
#       reward server per training process) — waits for the run to end, stops
#       everything.
#
# Environment: REMOTE_CONFIG and REMOTE_SCORER (default this directory's config.yaml and scorer.ts; the vision
# variant, examples/number-game-vision-remote/run.sh, sets them), REWARD_PORT (first port,
# default 8000; servers on REWARD_PORT and REWARD_PORT+1),
# LOG_DIR (default runs/number-game-remote/logs: one log per reward server and per stage),
# TIMEOUT_S (distributed mode: give up after this long, default 21600), REWARD_SERVER_LOG_LEVEL
# (default info; debug logs one line per scored request in the servers' logs), MAX_RESTARTS
# (distributed mode: restarts of a crashed stage process, default 3).
# Every process started here is stopped by PID on exit (also on Ctrl-C, SIGTERM or an error):
# training first, then the reward servers (they run in their own process group, so a Ctrl-C
# does not take them down under a trainer that is still finishing its batch).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."   # the repository root
MODE=embedded
if [[ ${1:-} == embedded || ${1:-} == distributed ]]; then MODE=$1; shift; fi
PORT=${REWARD_PORT:-8000}
COUNT=2
CONFIG=${REMOTE_CONFIG:-examples/number-game-remote/config.yaml}
SCORER=${REMOTE_SCORER:-examples/number-game-remote/scorer.ts}
LOG_DIR=${LOG_DIR:-runs/number-game-remote/logs}
TIMEOUT_S=${TIMEOUT_S:-21600}
RLSTREAM=(node bin/rlstream.mjs)
OVERRIDES=("reward.remote.host=127.0.0.1" "reward.remote.start_port=$PORT" "reward.remote.count=$COUNT" "$@")
mkdir -p "$LOG_DIR"

launcher=""          # the `rlstream reward-server --count 2` process (it forwards SIGTERM to its servers)
train_pid=""         # embedded mode: the `rlstream train` process
stage_pids=()        # distributed mode: the `rlstream serve` processes

server_pids() { sed -n 's/.* pid=\([0-9]*\) .*/\1/p' "$LOG_DIR/reward-server.out" 2>/dev/null || true; }

stop_pid() {   # stop_pid PID [grace seconds]: SIGTERM, wait (bounded), then SIGKILL
  local pid=$1 grace=${2:-15} i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  echo "run.sh: pid $pid still running after ${grace}s; SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
  local code=$? pid
  trap - EXIT INT TERM
  # training first (it finishes its in-flight batch, which may still need the servers), then the servers
  [[ -n $train_pid ]] && stop_pid "$train_pid" 60
  for pid in "${stage_pids[@]}"; do [[ -n $pid ]] && stop_pid "$pid" 30; done
  if [[ -n $launcher ]]; then
    stop_pid "$launcher" 15
    # the servers run in their own process groups: make sure none outlives the launcher
    for pid in $(server_pids); do stop_pid "$pid" 2; done
    echo "run.sh: reward servers stopped (logs: $LOG_DIR/reward-server-*.log)" >&2
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- reward servers ---------------------------------------------------------------------------
echo "run.sh: starting $COUNT reward servers on 127.0.0.1:$PORT..$((PORT + COUNT - 1)) (scorer $SCORER)" >&2
# In its own process group (set -m): a Ctrl-C in the terminal reaches the trainer, not the servers,
# which stay up until training has stopped (then cleanup stops them).
set -m
RLSTREAM_LOG_LEVEL=${REWARD_SERVER_LOG_LEVEL:-info} "${RLSTREAM[@]}" reward-server --scorer "$SCORER" --count "$COUNT" --port "$PORT" --host 127.0.0.1 \
  --log-dir "$LOG_DIR" >"$LOG_DIR/reward-server.out" 2>&1 &
launcher=$!
set +m

healthy() {   # healthy URL: 0 when GET URL answers 2xx
  node -e 'fetch(process.argv[1], { signal: AbortSignal.timeout(2000) }).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' "$1"
}
for ((i = 0; i < COUNT; i++)); do
  url="http://127.0.0.1:$((PORT + i))/healthz"
  for ((try = 0; ; try++)); do
    if ! kill -0 "$launcher" 2>/dev/null; then
      echo "run.sh: the reward servers exited during start-up:" >&2; cat "$LOG_DIR/reward-server.out" >&2; exit 1
    fi
    healthy "$url" && break
    if ((try >= 120)); then echo "run.sh: $url not healthy after 60 s" >&2; cat "$LOG_DIR/reward-server.out" >&2; exit 1; fi
    sleep 0.5
  done
done
cat "$LOG_DIR/reward-server.out" >&2

# ---- training ---------------------------------------------------------------------------------
if [[ $MODE == embedded ]]; then
  # in the background + wait, so that a SIGTERM to this script is handled at once (cleanup)
  "${RLSTREAM[@]}" train "$CONFIG" "${OVERRIDES[@]}" &
  train_pid=$!
  rc=0; wait "$train_pid" || rc=$?
  train_pid=""
  exit "$rc"
fi

: "${KAFKA_BROKERS:?distributed mode needs KAFKA_BROKERS=host:port[,host:port…]}"
: "${DATABASE_URL:?distributed mode needs DATABASE_URL=postgres://user@host:5432/database}"
# Each stage takes any free port for /healthz, /readyz and /metrics (they share this host; the port
# is in its log) and exits when the run has ended (on a Deployment they stay up idle instead).
DIST=("pipeline.bus=kafka" "pipeline.brokers=[$KAFKA_BROKERS]" "pipeline.store=postgres" "pipeline.database_url=$DATABASE_URL"
  "pipeline.http_port=0" "pipeline.on_run_end=exit")
# the schema once, before any stage starts (they wait for it): a Job in Kubernetes
"${RLSTREAM[@]}" migrate "$CONFIG" "${OVERRIDES[@]}" "${DIST[@]}" >"$LOG_DIR/migrate.log" 2>&1 \
  || { echo "run.sh: rlstream migrate failed:" >&2; cat "$LOG_DIR/migrate.log" >&2; exit 1; }
# one process per stage; two reward replicas: replica i prefers server i (one server per replica)
specs=("update 0" "controller 0" "rollout 0" "reward 0" "reward 1" "advantage 0")
restarts=()
stage_log() { local spec=${specs[$1]}; echo "$LOG_DIR/stage-${spec% *}-${spec#* }.log"; }
serve() {   # serve K: (re)starts stage K of specs; its output is appended to its log
  local spec=${specs[$1]}
  "${RLSTREAM[@]}" serve "${spec% *}" "$CONFIG" "${OVERRIDES[@]}" "${DIST[@]}" --replica "${spec#* }" >>"$(stage_log "$1")" 2>&1 &
  stage_pids[$1]=$!
}
for k in "${!specs[@]}"; do : >"$(stage_log "$k")"; restarts[k]=0; serve "$k"; done   # update first: it publishes policy version 0
echo "run.sh: stages started: ${specs[*]/ /#} (logs: $LOG_DIR/stage-*.log)" >&2

# Wait until every stage has exited. A stage that crashes is restarted (up to MAX_RESTARTS times,
# as a Kubernetes Deployment would: the stages resume from the log and the store); a stage that
# reports the run failed, or keeps crashing, stops the others.
MAX_RESTARTS=${MAX_RESTARTS:-3}
status=0
deadline=$((SECONDS + TIMEOUT_S))
while :; do
  running=0
  for k in "${!specs[@]}"; do
    pid=${stage_pids[$k]}
    [[ -z $pid ]] && continue
    if kill -0 "$pid" 2>/dev/null; then running=$((running + 1)); continue; fi
    rc=0; wait "$pid" || rc=$?
    stage_pids[k]=""
    ((rc == 0)) && continue
    log=$(stage_log "$k")
    if ! grep -q "run failed:" "$log" && ((restarts[k] < MAX_RESTARTS)); then
      restarts[k]=$((restarts[k] + 1))
      echo "run.sh: stage ${specs[$k]/ /#} exited with code $rc ($(tail -n 1 "$log" | cut -c1-300)); restart ${restarts[$k]} of $MAX_RESTARTS" >&2
      serve "$k"; running=$((running + 1))
      continue
    fi
    echo "run.sh: stage ${specs[$k]/ /#} exited with code $rc; stopping the others (log: $log)" >&2
    tail -n 5 "$log" >&2 || true
    status=1
  done
  ((running == 0)) && break
  if ((status != 0)); then break; fi
  if ((SECONDS > deadline)); then echo "run.sh: run not finished after ${TIMEOUT_S}s" >&2; status=1; break; fi
  sleep 1
done
exit "$status"
