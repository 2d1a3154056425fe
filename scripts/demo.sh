#!/usr/bin/env bash
# Grade the demo task with curl: its reference fix (resolved) and an empty patch (unresolved).
#
# Starts an executor on 127.0.0.1:$API_PORT (default 9090) unless one already answers there, and
# keeps it running afterwards (Ctrl-C stops it). With --exit it stops the executor it started and
# removes every file it made, which is how the test-suite checks that this script stays true.
# The demo task's setup builds its own test environment (a venv with pytest, from the package
# index), so nothing but an interpreter is asked of the machine's python3. A verdict other than
# the promised one is shown with its error and error_code, and the script exits 1.
set -euo pipefail

if ! python3 -c 'import task_executor' 2>/dev/null; then
    echo "demo: python3 ($(command -v python3 || echo 'not found')) cannot import task_executor;" \
        "run this from the environment where 'pip install -e .' ran" >&2
    exit 2
fi

port="${API_PORT:-9090}"
url="http://127.0.0.1:${port}"
auth=()
[[ -n "${API_TOKEN:-}" ]] && auth=(-H "Authorization: Bearer ${API_TOKEN}")
work="$(mktemp -d -t dockyard-demo.XXXXXX)"
# The sandbox's uid resolves its bind sources itself: it must pass through (not list) this dir.
chmod 711 "$work"
executor_pid=""
keep_work=""

cleanup() {
    if [[ -n "$executor_pid" ]]; then
        kill "$executor_pid" 2>/dev/null || true
        wait "$executor_pid" 2>/dev/null || true
    fi
    [[ -n "$keep_work" ]] || rm -rf "$work"
}
trap cleanup EXIT

python3 -m task_executor.demo "$work" >/dev/null
echo "demo repository and request bodies: $work"

if ! curl -sf "$url/health" >/dev/null 2>&1; then
    TASK_BASE_DIR="$work/executor" python3 -m task_executor serve --host 127.0.0.1 --port "$port" \
        >"$work/executor.out" 2>&1 &
    executor_pid=$!
    for _ in $(seq 1 600); do
        curl -sf "$url/health" >/dev/null 2>&1 && break
        kill -0 "$executor_pid" 2>/dev/null || { cat "$work/executor.out"; exit 1; }
        sleep 0.1
    done
    echo "executor started at $url (log: $work/executor/task_executor.log)"
fi

echo "(the first grading builds the demo's test environment, a venv with pytest: seconds to a minute)"
failed=0
for kind in gold empty; do
    expected=resolved
    [[ "$kind" == empty ]] && expected=unresolved
    echo "--- curl -X POST $url/task/submit --data @$work/$kind.json"
    if ! curl -sS -X POST "$url/task/submit" "${auth[@]}" -H 'Content-Type: application/json' \
        --data @"$work/$kind.json" | python3 -m task_executor.demo summary "$expected"; then
        failed=1
    fi
done
if [[ "$failed" != 0 ]]; then
    keep_work=1
    echo "demo: FAILED: a verdict is not the one promised (see above); request bodies and" \
        "executor log kept in $work" >&2
    exit 1
fi

if [[ "${1:-}" != "--exit" && -n "$executor_pid" ]]; then
    echo "executor still running at $url (pid $executor_pid); Ctrl-C stops it"
    wait "$executor_pid"
fi
