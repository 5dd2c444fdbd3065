#!/usr/bin/env bash
# Manual check of tests/torchrun/train.py, driven the way allot drives a torchrun gang,
# without allot: NODES "hosts" on this machine, each its own `setsid torchrun` tree with
# allot's environment. Each run trains a few steps, then every process of every host gets
# SIGUSR1 at once (like allot's cgroup-wide signal); all ranks must checkpoint at one
# step, both markers must appear and everything must exit within GRACE. The next run
# (ALLOT_RUN+1, new port, new ALLOT_CHECKPOINT_DIR) must resume at exactly that step.
# After CYCLES preemptions the last run goes to --steps and must exit 0 with the same
# weights as an uninterrupted reference run.
#
#   tests/torchrun/check_locally.sh            # venv: $ALLOT_TEST_TORCH_VENV or /tmp/tv
#   NPROC=2 CYCLES=2 tests/torchrun/check_locally.sh
set -euo pipefail
VENV=${ALLOT_TEST_TORCH_VENV:-/tmp/tv}
HERE=$(cd "$(dirname "$0")" && pwd)
NODES=${NODES:-2} NPROC=${NPROC:-8} CYCLES=${CYCLES:-5} STEPS=${STEPS:-60}
STEPS_PER_RUN=${STEPS_PER_RUN:-5} GRACE=${GRACE:-60} START_TIMEOUT=${START_TIMEOUT:-300}
WORLD=$((NODES * NPROC))
WORK=$(mktemp -d /tmp/allot-torchrun.XXXXXX)
WID=torchrun-check-$$ # in every process's environment: how we find them, like a cgroup

members() { # pids whose environment holds $1 (ALLOT_CHECKPOINT_DIR=… or the workload id)
  grep -lzxF -- "$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}
cleanup() {
  local p
  p=$(members "ALLOT_WORKLOAD_ID=$WID")
  [ -z "$p" ] || { echo "cleanup: killing leftover pids" $p >&2; kill -KILL $p 2>/dev/null || true; }
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "logs kept in $WORK" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
mem_mb() { # total PSS (shared pages split among sharers) of the given pids, MiB
  local p
  for p in "$@"; do cat "/proc/$p/smaps_rollup" 2>/dev/null || true; done |
    awk '$1 == "Pss:" { s += $2 } END { printf "%d", s / 1024 }'
}

start_run() { # $1 = ckpt dir, $2 = run: start all hosts of one run
  local ckpt=$1 run=$2 port h d
  port=$(free_port)
  for ((h = 0; h < NODES; h++)); do
    d=$WORK/run$run/host$h
    mkdir -p "$d/ckptdir"
    # The subshell records torchrun's exit code; setsid makes torchrun a session
    # leader, as allot does (torchrun then puts each worker in a session of its own).
    (
      rc=0
      env PET_NNODES=$NODES PET_NODE_RANK=$h PET_NPROC_PER_NODE=$NPROC \
        PET_MASTER_ADDR=127.0.0.1 PET_MASTER_PORT=$port MASTER_ADDR=127.0.0.1 \
        MASTER_PORT=$port WORLD_SIZE=$WORLD NODE_RANK=$h ALLOT_WORKLOAD_ID=$WID \
        ALLOT_RUN=$run ALLOT_CHECKPOINT_DIR="$d/ckptdir" \
        PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
        setsid "$VENV/bin/torchrun" "$HERE/train.py" --ckpt-dir "$ckpt" --steps "$STEPS" \
        >"$d/out" 2>"$d/err" </dev/null || rc=$?
      echo "$rc" >"$d/rc"
    ) &
  done
}
run_pids() { local h; for ((h = 0; h < NODES; h++)); do members "ALLOT_CHECKPOINT_DIR=$WORK/run$1/host$h/ckptdir"; done; }
all_out() { cat "$WORK/run$1"/host*/out; }
exited() { # all hosts' torchrun returned and no process of the run is left
  local h
  for ((h = 0; h < NODES; h++)); do [ -f "$WORK/run$1/host$h/rc" ] || return 1; done
  [ -z "$(run_pids "$1")" ]
}
rcs() { cat "$WORK/run$1"/host*/rc | tr '\n' ' '; }
wait_exit() { # $1 run, $2 timeout s: 0 once exited; else SIGTERM, SIGKILL, fail
  local end
  end=$(awk -v t="$(now)" -v d="$2" 'BEGIN { printf "%.3f", t + d }')
  until exited "$1"; do
    if awk -v t="$(now)" -v e="$end" 'BEGIN { exit !(t > e) }'; then
      kill -TERM $(run_pids "$1") 2>/dev/null || true
      sleep 5
      kill -KILL $(run_pids "$1") 2>/dev/null || true
      fail "run $1 did not exit within $2 s"
    fi
    sleep 0.2
  done
}
# Each of the WORLD ranks printed "$1 rank=R step=S run=$2" exactly once, all with one S.
same_step() {
  local lines ranks steps
  lines=$(all_out "$2" | grep -E "^$1 rank=[0-9]+ step=[0-9]+ run=$2( |$)" || true)
  ranks=$(echo "$lines" | sed -E 's/.* rank=([0-9]+) .*/\1/' | sort -n | uniq | tr '\n' ' ')
  steps=$(echo "$lines" | sed -E 's/.* step=([0-9]+) .*/\1/' | sort -u)
  [ "$(echo "$lines" | grep -c .)" = "$WORLD" ] && [ "$ranks" = "$(seq -s ' ' 0 $((WORLD - 1))) " ] &&
    [ "$(echo "$steps" | wc -l)" = 1 ] || fail "run $2: '$1' lines are not one per rank at one step:
$lines"
  echo "$steps"
}

echo "work dir $WORK; $NODES hosts x $NPROC ranks, $CYCLES preemptions, --steps $STEPS"
CKPT=$WORK/ckpt prev=0 peak=0
for ((run = 1; run <= CYCLES + 1; run++)); do
  t0=$(now)
  start_run "$CKPT" "$run"
  # Wait for STEPS_PER_RUN new steps (or, on the last run, for the end).
  want=$((prev + STEPS_PER_RUN)) first=
  while :; do
    last=$(grep -oE "^step=[0-9]+ .* run=$run\$" "$WORK/run$run/host0/out" 2>/dev/null | tail -1 | sed -E 's/step=([0-9]+).*/\1/' || true)
    [ -n "$last" ] && [ -z "$first" ] && first=$(since "$t0")
    mem=$(mem_mb $(run_pids "$run")) && [ "$mem" -gt "$peak" ] && peak=$mem
    [ "$run" -le "$CYCLES" ] && [ -n "$last" ] && [ "$last" -ge "$want" ] && break
    [ "$run" -gt "$CYCLES" ] && exited "$run" && break
    exited "$run" && fail "run $run exited early (rc $(rcs "$run"))"
    awk -v s="$(since "$t0")" -v t="$START_TIMEOUT" 'BEGIN { exit !(s > t) }' && fail "run $run: no progress in $START_TIMEOUT s"
    sleep 0.5
  done
  resumed=$(same_step resumed "$run")
  [ "$resumed" = "$prev" ] || fail "run $run resumed at step $resumed, checkpoint was $prev"
  if [ "$run" -gt "$CYCLES" ]; then
    [ "$(rcs "$run")" = "$(printf '0 %.0s' $(seq $NODES))" ] || fail "last run: torchrun exit codes $(rcs "$run")"
    [ "$(same_step done "$run")" = "$STEPS" ] || fail "last run did not end at step $STEPS"
    weights=$(all_out "$run" | grep '^done ' | sed 's/.*weights=//' | sort -u)
    echo "run $run: resumed at $resumed, first step after ${first}s, done at $STEPS, exit codes $(rcs "$run"), total $(since "$t0")s, weights $weights"
    break
  fi
  # Preempt: SIGUSR1 to every process of every host at once (agents and workers).
  pids=$(run_pids "$run")
  t1=$(now)
  kill -USR1 $pids || true # one may just have exited
  wait_exit "$run" "$GRACE"
  took=$(since "$t1")
  step=$(same_step checkpointed "$run")
  marked=0
  for ((h = 0; h < NODES; h++)); do
    m=$WORK/run$run/host$h/ckptdir/checkpoint.done
    [ -f "$m" ] || fail "run $run: host $h has no checkpoint.done"
    marked=$(awk -v a="$t1" -v b="$(stat -c %.3Y "$m")" -v m="$marked" 'BEGIN { printf "%.2f", (b - a > m) ? b - a : m }')
  done
  grep -qxF "{\"step\": $step, \"world\": $WORLD, \"run\": $run}" "$CKPT/complete.json" ||
    fail "run $run: complete.json is $(cat "$CKPT/complete.json")"
  [ "$step" -ge "$want" ] || fail "run $run checkpointed at $step, before step $want"
  echo "run $run: resumed at $resumed, first step after ${first}s, SIGUSR1 to $(echo $pids | wc -w) pids at step >= $want," \
    "all checkpointed at $step, markers ${marked}s later, all exited ${took}s later, torchrun exit codes $(rcs "$run")"
  prev=$step
done
echo "peak PSS of one run's processes: ${peak} MiB"

# Reference: the same job, never interrupted, must end with the same weights.
t0=$(now)
start_run "$WORK/ckpt-ref" ref
wait_exit ref "$START_TIMEOUT"
ref=$(all_out ref | grep '^done ' | sed 's/.*weights=//' | sort -u)
[ "$(rcs ref)" = "$(printf '0 %.0s' $(seq $NODES))" ] || fail "reference run: exit codes $(rcs ref)"
[ "$ref" = "$weights" ] || fail "weights differ: preempted $weights, uninterrupted $ref"
echo "uninterrupted reference run: $(since "$t0")s, same weights $ref"
echo PASS
rm -rf "$WORK"
