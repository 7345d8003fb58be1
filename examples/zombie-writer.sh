#!/bin/sh
# The zombie writer, end to end: why a lock needs fencing tokens, and how a store uses them.
#
# Client 1 takes the lock and, just before it writes, is paused (a stop-the-world GC pause, a VM
# migration, a laptop lid: here SIGSTOP to lockctl and its job). Its lease runs out. Client 2 takes the
# lock and writes. Client 1 wakes up still in the middle of its write. No lock can stop that write, since
# it was already on its way; the store can, because every write carries the fencing token of the grant
# it was made under and the store refuses a token lower than one it has seen:
#
#     UPDATE store SET value = :value, fence = :fence WHERE id = 1 AND fence < :fence
#
# Client 1's lockctl, on waking, finds its lease expired and exits 76.
#
# Runs its own redis-server on a unix socket in a temporary directory and removes everything on exit.
# Needs redis-server, redis-cli and sqlite3. LOCKCTL names the lockctl binary (default: the one built
# in this repository's target/debug, else lockctl on PATH). Exits 0 when the outcome is the expected
# one, 1 otherwise; the last line is a machine-readable summary.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LOCKCTL:-}" ]; then
    if [ -x "$here/../target/debug/lockctl" ]; then
        LOCKCTL="$here/../target/debug/lockctl"
    else
        LOCKCTL=lockctl
    fi
fi
for tool in redis-server redis-cli sqlite3 "$LOCKCTL"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "zombie-writer: $tool is required" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/lockctl-zombie.XXXXXX")
redis_pid=
client1=
job1=
cleanup() {
    # A stopped process would never die of SIGTERM: continue it first.
    for p in $job1 $client1; do
        kill -CONT "$p" 2>/dev/null || true
    done
    [ -n "$job1" ] && kill -KILL "-$job1" 2>/dev/null || true
    [ -n "$client1" ] && kill -KILL "$client1" 2>/dev/null || true
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }

sock="$tmp/redis.sock"
redis-server --port 0 --unixsocket "$sock" --dir "$tmp" --save '' --appendonly no \
    --logfile "$tmp/redis.log" &
redis_pid=$!
tries=0
until redis-cli -s "$sock" ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -lt 500 ] || { echo "zombie-writer: redis-server did not start" >&2; exit 1; }
    sleep 0.02
done
export LOCKCTL_REDIS="unix://$sock"
# The server was started a moment ago; its restart quarantine would hold off the first grant for one
# TTL. That rule is for servers that restarted and lost their locks, which this one did not.
export LOCKCTL_QUARANTINE=0

db="$tmp/store.db"
sqlite3 "$db" "CREATE TABLE store(id INTEGER PRIMARY KEY, value TEXT NOT NULL, fence INTEGER NOT NULL);
               INSERT INTO store VALUES (1, 'initial', 0);"

# The job each client runs under the lock: one fenced write.
cat >"$tmp/job.sh" <<'EOF'
#!/bin/sh
set -eu
me=$1
# Like most jobs, it finishes the write it has started before it stops: SIGTERM is no guard.
trap '' TERM
echo $$ >"$DIR/$me.pid"
echo "[$me] holds the lock, fencing token $LOCKCTL_FENCE"
if [ "${PAUSE:-}" = 1 ]; then
    echo "[$me] has prepared its write..."
    : >"$DIR/$me.ready"
    while [ ! -e "$DIR/$me.go" ]; do sleep 0.02; done
fi
changed=$(sqlite3 -cmd ".timeout 5000" -cmd ".parameter set :value '$me'" \
    -cmd ".parameter set :fence $LOCKCTL_FENCE" "$DB" \
    "UPDATE store SET value = :value, fence = :fence WHERE id = 1 AND fence < :fence; SELECT changes();")
if [ "$changed" = 1 ]; then
    echo "[$me] write ACCEPTED with token $LOCKCTL_FENCE"
    echo accepted >"$DIR/$me.result"
else
    echo "[$me] write REJECTED: the store has already seen a token above $LOCKCTL_FENCE"
    echo rejected >"$DIR/$me.result"
fi
EOF
export DIR="$tmp" DB="$db"

step "Client 1 takes the lock (TTL 2s) and prepares a write"
PAUSE=1 "$LOCKCTL" exec zombie --ttl 2s --kill-after 5s -- sh "$tmp/job.sh" client-1 2>&1 &
client1=$!
tries=0
until [ -e "$tmp/client-1.ready" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 1000 ] || { echo "zombie-writer: client 1 never got the lock" >&2; exit 1; }
    sleep 0.02
done
job1=$(cat "$tmp/client-1.pid")

step "Client 1 pauses just before its write (SIGSTOP to lockctl pid $client1 and its job, pid $job1)"
kill -STOP "$client1"
kill -STOP "-$job1"
# The write is on its way: it goes out the moment the client runs again.
: >"$tmp/client-1.go"
say "while it is stopped, nothing renews its lease; Redis lets the key expire..."
tries=0
until [ "$(redis-cli -s "$sock" pttl lockctl:zombie)" = "-2" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 1000 ] || { echo "zombie-writer: the lock never expired" >&2; exit 1; }
    sleep 0.05
done
say "the lock 'zombie' has expired in Redis; client 1 does not know"

step "Client 2 takes the lock and writes"
rc2=0
"$LOCKCTL" exec zombie --ttl 2s -- sh "$tmp/job.sh" client-2 2>&1 || rc2=$?
say "client 2's lockctl exited $rc2"
say "store now: $(sqlite3 "$db" "SELECT value || ' (fence ' || fence || ')' FROM store WHERE id = 1;")"

step "Client 1 wakes up (SIGCONT) and its write goes out"
kill -CONT "-$job1"
kill -CONT "$client1"
rc1=0
wait "$client1" || rc1=$?
client1=
job1=
say "client 1's lockctl exited $rc1 (76: the lease was lost)"

step "Outcome"
value=$(sqlite3 "$db" "SELECT value FROM store WHERE id = 1;")
fence=$(sqlite3 "$db" "SELECT fence FROM store WHERE id = 1;")
write1=$(cat "$tmp/client-1.result" 2>/dev/null || echo none)
write2=$(cat "$tmp/client-2.result" 2>/dev/null || echo none)
say "the store holds '$value' with fence $fence: client 2's write survived the zombie"
ok=1
[ "$value" = client-2 ] && [ "$write1" = rejected ] && [ "$write2" = accepted ] \
    && [ "$rc1" = 76 ] && [ "$rc2" = 0 ] || ok=0
say "RESULT value=$value fence=$fence client1_write=$write1 client1_exit=$rc1 client2_write=$write2 client2_exit=$rc2 ok=$ok"
[ "$ok" = 1 ]
