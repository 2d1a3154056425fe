#!/usr/bin/env bash
# Grade the demo task with curl: its reference fix (resolved) and an empty patch (unresolved).
#
# Starts an executor on 127.0.0.1:$API_PORT (default 9090) unless one already answers there, and
# keeps it running afterwards (Ctrl-C stops it). With --exit it stops the executor it started and
# removes every file it made, which is how the test-suite checks that this script stays true.
set -euo pipefail

port="${API_PORT:-9090}"
url="http://127.0.0.1:${port}"
auth=()
[[ -n "${API_TOKEN:-}" ]] && auth=(-H "Authorization: Bearer ${API_TOKEN}")
work="$(mktemp -d -t dockyard-demo.XXXXXX)"
# The sandbox's uid resolves its bind sources itself: it must pass through (not list) this dir.
chmod 711 "$work"
executor_pid=""

cleanup() {
    if [[ -n "$executor_pid" ]]; then
        kill "$executor_pid" 2>/dev/null || true
        wait "$executor_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

python3 -m task_executor.demo "$work" >/dev/null
echo "demo repository and request bodies: $work"

if ! curl -sf "$url/health" >/dev/null 2>&1; then
    TASK_BASE_DIR="$work/executor" python3 -m task_executor serve --host 127.0.0.1 --port "$port" \
        >"$work/executor.out" 2>&1 &
    executor_pid=$!
    for _ in $(seq 1 100); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        kill -0 "$executor_pid" 2>/dev/null || { cat "$work/executor.out"; exit 1; }
        sleep 0.1
    done
    echo "executor started at $url (log: $work/executor/task_executor.log)"
fi

for kind in gold empty; do
    echo "--- curl -X POST $url/task/submit --data @$work/$kind.json"
    curl -sS -X POST "$url/task/submit" "${auth[@]}" -H 'Content-Type: application/json' \
        --data @"$work/$kind.json" | python3 -m task_executor.demo summary
done

if [[ "${1:-}" != "--exit" && -n "$executor_pid" ]]; then
    echo "executor still running at $url (pid $executor_pid); Ctrl-C stops it"
    wait "$executor_pid"
fi
