#!/usr/bin/env bash
# pgstack.sh start|stop STATEDIR [EXTRA_CONF_FILE]
#
# Starts (or stops and removes) a throwaway PostgreSQL 15 cluster for the
# tests: a temp directory, a free loopback port, wal_level=logical, a short
# wal_sender_timeout so timeout bugs show.  As root it runs the server as the
# unprivileged postgres user (initdb refuses root).  "start" writes
# STATEDIR/env with OBX_PG* variables for the tests; "stop" reads it, stops
# the server it started (by its own pid file) and removes the directory.
#
# Another major: OBX_PGBIN=/path/to/bin picks the server (initdb, pg_ctl,
# postgres); scripts/pg-majors.sh installs 13, 14, 16, 17 and 18, e.g.
#   OBX_PGBIN=$(scripts/pg-majors.sh --bin 16) ctest
# Those builds have no client tools, so when OBX_PGBIN lacks psql, pgbench or
# pg_recvlogical the cluster gets a bin directory of its own: links to the
# server's programs plus the missing clients from OBX_PGCLIENTBIN (Debian's
# 15 by default, whose clients talk to servers 13..18).  The env file's
# OBX_PGBIN is that directory, so tests that run $OBX_PGBIN/psql, pgbench or
# pg_ctl work unchanged; OBX_PGSERVERBIN is the server's own and OBX_PGMAJOR
# its major.  Unset, OBX_PGBIN is Debian's 15 and nothing of this happens.
set -euo pipefail

cmd=${1:-}
state=${2:-}
extra=${3:-}
if [ -z "$cmd" ] || [ -z "$state" ]; then
	echo "usage: pgstack.sh start|stop STATEDIR" >&2
	exit 2
fi

pgbin=${OBX_PGBIN:-/usr/lib/postgresql/15/bin}
clientbin=${OBX_PGCLIENTBIN:-/usr/lib/postgresql/15/bin}
clients=(psql pgbench pg_recvlogical pg_dump pg_basebackup pg_isready)
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
	as_pg=(runuser -u postgres --)
fi

free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	echo "pgstack: no free port found" >&2
	return 1
}

stop() {
	[ -f "$state/env" ] || return 0
	# shellcheck disable=SC1091
	. "$state/env"
	# the server that start used, whatever OBX_PGBIN says now
	local sbin=${OBX_PGSERVERBIN:-${OBX_PGBIN:-$pgbin}}
	if [ -n "${OBX_PGDATA:-}" ] && [ -f "$OBX_PGDATA/postmaster.pid" ]; then
		"${as_pg[@]}" "$sbin/pg_ctl" -D "$OBX_PGDATA" -m immediate -w stop >/dev/null 2>&1 ||
			kill -9 "$(head -1 "$OBX_PGDATA/postmaster.pid")" 2>/dev/null || true
	fi
	if [ -n "${OBX_PGROOT:-}" ] && [ -d "$OBX_PGROOT" ]; then
		rm -rf "$OBX_PGROOT"
	fi
	rm -f "$state/env"
}

start() {
	stop
	mkdir -p "$state"
	local root port
	root=$(mktemp -d /tmp/obx-pg.XXXXXX)
	chmod 755 "$root"
	if [ "$(id -u)" -eq 0 ]; then
		chown postgres: "$root"
	fi
	port=$(free_port)
	local major envbin=$pgbin c
	major=$("$pgbin/postgres" --version | awk '{print $3}' | cut -d. -f1)
	if [ ! -x "$pgbin/psql" ] || [ ! -x "$pgbin/pgbench" ] || [ ! -x "$pgbin/pg_recvlogical" ]; then
		# a server-only build: its programs and the clients in one directory
		envbin=$root/bin
		mkdir "$envbin"
		for c in "$pgbin"/*; do ln -s "$c" "$envbin/"; done
		for c in "${clients[@]}"; do
			if [ ! -e "$envbin/$c" ] && [ -x "$clientbin/$c" ]; then
				ln -s "$clientbin/$c" "$envbin/$c"
			fi
		done
	fi
	"${as_pg[@]}" "$pgbin/initdb" -D "$root/data" -U postgres -A trust -E UTF8 \
		--no-sync >"$root/initdb.log" 2>&1 || { cat "$root/initdb.log" >&2; rm -rf "$root"; exit 1; }
	cat >>"$root/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$root'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
wal_sender_timeout = 10s
max_connections = 100
fsync = on
shared_buffers = 128MB
logging_collector = off
log_min_messages = warning
CONF
	if [ -n "${extra:-}" ]; then
		cat "$extra" >>"$root/data/postgresql.conf"
		# files named in the extra settings (TLS keys) are copied next to it
		for f in "$(dirname "$extra")"/server.crt "$(dirname "$extra")"/server.key; do
			[ -f "$f" ] && install -m 600 "$f" "$root/data/"
		done
		if [ "$(id -u)" -eq 0 ]; then chown postgres: "$root/data"/server.* 2>/dev/null || true; fi
	fi
	# password auth over TCP for tests that check credentials; trust on the socket
	cat >"$root/data/pg_hba.conf" <<HBA
host    all           pwuser 127.0.0.1/32  scram-sha-256
host    replication   pwuser 127.0.0.1/32  scram-sha-256
local   all           all                 trust
local   replication   all                 trust
host    all           all   127.0.0.1/32  trust
host    replication   all   127.0.0.1/32  trust
HBA
	cat >"$state/env" <<ENV
OBX_PGROOT=$root
OBX_PGDATA=$root/data
OBX_PGHOST=127.0.0.1
OBX_PGPORT=$port
OBX_PGUSER=postgres
OBX_PGBIN=$envbin
OBX_PGSERVERBIN=$pgbin
OBX_PGMAJOR=$major
OBX_PGSOCKDIR=$root
ENV
	local try
	for try in 1 2 3 4 5; do
		if "${as_pg[@]}" "$pgbin/pg_ctl" -D "$root/data" -l "$root/server.log" -w -t 60 start >/dev/null 2>"$root/pg_ctl.err"; then
			break
		fi
		# another run's server took the port between free_port and the bind
		# (test runs in parallel on one machine): take another port
		if [ "$try" -lt 5 ] && grep -q 'could not create any TCP/IP sockets' "$root/server.log"; then
			port=$(free_port)
			sed -i "s/^port = .*/port = $port/" "$root/data/postgresql.conf"
			sed -i "s/^OBX_PGPORT=.*/OBX_PGPORT=$port/" "$state/env"
			rm -f "$root/server.log"
			continue
		fi
		cat "$root/pg_ctl.err" "$root/server.log" >&2 || true
		stop
		exit 1
	done
	echo "pgstack: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, data $root/data"
}

case "$cmd" in
start) start ;;
stop) stop ;;
*) echo "usage: pgstack.sh start|stop STATEDIR" >&2; exit 2 ;;
esac
