# A throwaway PostgreSQL server for the benchmarks, sourced by
# bench/coordinator/run.sh and bench/ha/run.sh. Needs $WORK (a directory of
# the caller's, removed by it) and $OUT (its key=value results file); Debian's
# postgresql server binaries. Unix socket only (no TCP port to collide with);
# as nobody when run as root (PostgreSQL refuses root).
PG_PID=""
PG_DIR=""
PG_WHY=""
PG_STORE=""

# start_pg: a PostgreSQL server listening only on a
# Unix socket in $PG_DIR; sets PG_PID (the postmaster) and PG_STORE (the
# --store value), or returns 1 with the reason in PG_WHY. Durable as the SQLite store is
# (fsync on, synchronous_commit on: the defaults).
start_pg() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [[ -z "$bin" || ! -x "$bin/initdb" ]]; then PG_WHY="no PostgreSQL server in /usr/lib/postgresql/*/bin (Debian: postgresql)"; return 1; fi
  PG_DIR="$WORK/pg"
  mkdir -p "$PG_DIR"
  local as=()
  # PostgreSQL refuses to run as root: as nobody then, in a directory it owns
  # (under $WORK, which mktemp made 0700).
  if [[ $(id -u) -eq 0 ]]; then chmod o+x "$WORK"; chown nobody "$PG_DIR"; as=(runuser -u nobody --); fi
  "${as[@]}" "$bin/initdb" -D "$PG_DIR/data" -U trainctl --auth=trust > "$PG_DIR/initdb.log" 2>&1 \
    || { PG_WHY="initdb failed: $(tail -3 "$PG_DIR/initdb.log")"; return 1; }
  "${as[@]}" "$bin/postgres" -D "$PG_DIR/data" -k "$PG_DIR" -c listen_addresses= > "$PG_DIR/server.log" 2>&1 &
  local launcher=$! i
  for i in $(seq 1 100); do
    "$bin/pg_isready" -q -h "$PG_DIR" -U trainctl 2>/dev/null && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  # The postmaster (runuser's child when run as root): what gets signalled and measured.
  PG_PID=$(head -1 "$PG_DIR/data/postmaster.pid" 2>/dev/null || true)
  "$bin/createdb" -h "$PG_DIR" -U trainctl trainctl 2>> "$PG_DIR/server.log" \
    || { PG_WHY="PostgreSQL did not start: $(tail -3 "$PG_DIR/server.log")"; return 1; }
  PG_STORE="postgresql:///trainctl?host=$PG_DIR&user=trainctl"
  echo "meta.pg_version=$("$bin/postgres" --version | awk '{print $3}')" >> "$OUT"
}
stop_pg() {
  [[ -n "$PG_PID" ]] || return 0
  kill -INT "$PG_PID" 2>/dev/null || true  # fast shutdown
  local i
  for i in $(seq 1 100); do kill -0 "$PG_PID" 2>/dev/null || break; sleep 0.1; done
  PG_PID=""
  [[ -n "$PG_DIR" ]] && rm -rf "$PG_DIR/data"
}
