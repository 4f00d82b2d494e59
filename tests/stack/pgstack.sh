#!/usr/bin/env bash
# pgstack.sh start|stop STATEDIR [EXTRA_CONF_FILE]
# pgstack.sh standby PRIMARY_STATEDIR STATEDIR
# pgstack.sh promote|stop-immediate STATEDIR
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
#
# "standby" makes a physical standby of the cluster started in
# PRIMARY_STATEDIR, with the same server programs, in a directory of its own
# (STATEDIR/env as for start, plus OBX_PGPRIMARYSLOT): a physical slot on
# the primary (reserving WAL at once), a copy of the data directory between
# pg_backup_start and pg_backup_stop (pg_start_backup/pg_stop_backup before
# 15; the server-only builds have no pg_basebackup), standby.signal,
# primary_conninfo with a dbname, primary_slot_name and
# hot_standby_feedback = on; from 17 also sync_replication_slots = on on the
# standby and, on the primary, the physical slot added to
# synchronized_standby_slots.  It returns once the standby streams.  "stop"
# of a standby also gives its slot and synchronized_standby_slots entry back
# when the primary still runs.  "promote" promotes a standby and waits;
# "stop-immediate" stops a server with -m immediate (a crash) and keeps its
# directory until "stop".
set -euo pipefail

cmd=${1:-}
state=${2:-}
extra=${3:-}
usage() {
	echo "usage: pgstack.sh start|stop|promote|stop-immediate STATEDIR [EXTRA_CONF_FILE]" >&2
	echo "       pgstack.sh standby PRIMARY_STATEDIR STATEDIR" >&2
	exit 2
}
if [ -z "$cmd" ] || [ -z "$state" ]; then
	usage
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

# envval STATEDIR NAME: a value of STATEDIR/env, without touching this shell's variables
envval() {
	(
		# shellcheck disable=SC1091
		. "$1/env"
		eval "printf '%s' \"\${$2:-}\""
	)
}

# psql with the clients that talk to every major
pg_psql() {
	local bin=$pgbin
	[ -x "$bin/psql" ] || bin=$clientbin
	PGCONNECT_TIMEOUT=5 "$bin/psql" -X -q -v ON_ERROR_STOP=1 "$@"
}

# set_standby_slots HOST PORT ADD REMOVE: synchronized_standby_slots on a
# primary (17+) with slot ADD added and slot REMOVE taken out, then a reload
set_standby_slots() {
	local list
	list=$(pg_psql -At -h "$1" -p "$2" -U postgres -d postgres -c "
		SELECT coalesce(string_agg(s, ','), '') FROM (
			SELECT btrim(s) s FROM unnest(string_to_array(current_setting('synchronized_standby_slots'), ',')) s
			UNION SELECT nullif('$3', '')) x
		WHERE s IS NOT NULL AND s NOT IN ('', '$4')")
	pg_psql -h "$1" -p "$2" -U postgres -d postgres \
		-c "ALTER SYSTEM SET synchronized_standby_slots = '$list'" -c "SELECT pg_reload_conf()" >/dev/null
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
	# a standby gives back what it took on a primary that still runs
	if [ -n "${OBX_PGPRIMARYSLOT:-}" ]; then
		pg_psql -h "$OBX_PGPRIMARYHOST" -p "$OBX_PGPRIMARYPORT" -U postgres -d postgres \
			-c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			    WHERE slot_name = '$OBX_PGPRIMARYSLOT' AND NOT active" >/dev/null 2>&1 || true
		if [ "${OBX_PGMAJOR:-0}" -ge 17 ]; then
			set_standby_slots "$OBX_PGPRIMARYHOST" "$OBX_PGPRIMARYPORT" "" "$OBX_PGPRIMARYSLOT" \
				>/dev/null 2>&1 || true
		fi
	fi
	if [ -n "${OBX_PGROOT:-}" ] && [ -d "$OBX_PGROOT" ]; then
		rm -rf "$OBX_PGROOT"
	fi
	rm -f "$state/env"
}

# make_envbin ROOT: prints the bin directory for the env file (see the top)
make_envbin() {
	local envbin=$pgbin c
	if [ ! -x "$pgbin/psql" ] || [ ! -x "$pgbin/pgbench" ] || [ ! -x "$pgbin/pg_recvlogical" ]; then
		# a server-only build: its programs and the clients in one directory
		envbin=$1/bin
		mkdir "$envbin"
		for c in "$pgbin"/*; do ln -s "$c" "$envbin/"; done
		for c in "${clients[@]}"; do
			if [ ! -e "$envbin/$c" ] && [ -x "$clientbin/$c" ]; then
				ln -s "$clientbin/$c" "$envbin/$c"
			fi
		done
	fi
	echo "$envbin"
}

# pg_start ROOT PORT: starts the server in ROOT/data, taking another port
# when another run's server took this one between free_port and the bind
# (test runs in parallel on one machine); prints the port it got
pg_start() {
	local root=$1 port=$2 try
	for try in 1 2 3 4 5; do
		if "${as_pg[@]}" "$pgbin/pg_ctl" -D "$root/data" -l "$root/server.log" -w -t 60 start >/dev/null 2>"$root/pg_ctl.err"; then
			echo "$port"
			return 0
		fi
		if [ "$try" -lt 5 ] && grep -q 'could not create any TCP/IP sockets' "$root/server.log"; then
			port=$(free_port)
			sed -i "s/^port = .*/port = $port/" "$root/data/postgresql.conf"
			rm -f "$root/server.log"
			continue
		fi
		cat "$root/pg_ctl.err" "$root/server.log" >&2 || true
		return 1
	done
}

# write_env ROOT PORT ENVBIN MAJOR: the state's env file for the tests (see the top)
write_env() {
	cat >"$state/env" <<ENV
OBX_PGROOT=$1
OBX_PGDATA=$1/data
OBX_PGHOST=127.0.0.1
OBX_PGPORT=$2
OBX_PGUSER=postgres
OBX_PGBIN=$3
OBX_PGSERVERBIN=$pgbin
OBX_PGMAJOR=$4
OBX_PGSOCKDIR=$1
ENV
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
	local major envbin
	major=$("$pgbin/postgres" --version | awk '{print $3}' | cut -d. -f1)
	envbin=$(make_envbin "$root")
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
	write_env "$root" "$port" "$envbin" "$major"
	if ! port=$(pg_start "$root" "$port"); then
		stop
		exit 1
	fi
	sed -i "s/^OBX_PGPORT=.*/OBX_PGPORT=$port/" "$state/env"
	echo "pgstack: PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, data $root/data"
}

standby() {
	local pstate=$state
	state=$3
	stop
	[ -f "$pstate/env" ] || { echo "pgstack: no cluster in $pstate" >&2; exit 1; }
	pgbin=$(envval "$pstate" OBX_PGSERVERBIN)
	local phost pport pdata major root port slot envbin
	phost=$(envval "$pstate" OBX_PGHOST)
	pport=$(envval "$pstate" OBX_PGPORT)
	pdata=$(envval "$pstate" OBX_PGDATA)
	major=$(envval "$pstate" OBX_PGMAJOR)
	mkdir -p "$state"
	root=$(mktemp -d /tmp/obx-pg.XXXXXX)
	chmod 755 "$root"
	slot=obx_standby_$(basename "$root" | tr 'A-Z.-' 'a-z__' | sed 's/^obx_pg_//')
	# the env file first, so that stop cleans up whatever comes next
	envbin=$(make_envbin "$root")
	port=$(free_port)
	write_env "$root" "$port" "$envbin" "$major"
	cat >>"$state/env" <<ENV
OBX_PGPRIMARYHOST=$phost
OBX_PGPRIMARYPORT=$pport
OBX_PGPRIMARYSLOT=$slot
ENV
	local P=(-h "$phost" -p "$pport" -U postgres -d postgres)
	pg_psql "${P[@]}" -c "SELECT pg_create_physical_replication_slot('$slot', true)" >/dev/null
	# the low-level backup API: one session around the copy (non-exclusive)
	local bstart="pg_backup_start('obx standby', true)" bstop="pg_backup_stop(false)"
	if [ "$major" -lt 15 ]; then
		bstart="pg_start_backup('obx standby', true, false)"
		bstop="pg_stop_backup(false, false)"
	fi
	mkdir "$root/data"
	# tar exits 1 when a file changed while it was read, which a running server's files do
	cat >"$root/copy.sh" <<SH
tar -C '$pdata' -cf - --exclude=./postmaster.pid --exclude=./postmaster.opts \\
	--exclude='./pg_replslot/*' --exclude='./pg_wal/*' --exclude='./pg_stat_tmp/*' . 2>/dev/null |
	tar -C '$root/data' -xf -
st=("\${PIPESTATUS[@]}")
[ "\${st[0]}" -le 1 ] && [ "\${st[1]}" -eq 0 ] && touch '$root/copied'
SH
	pg_psql "${P[@]}" -At >"$root/backup_label" <<SQL
SELECT 1 FROM $bstart \\g /dev/null
\\! bash '$root/copy.sh'
SELECT labelfile FROM $bstop;
SQL
	[ -f "$root/copied" ] || { echo "pgstack: could not copy $pdata" >&2; stop; exit 1; }
	mv "$root/backup_label" "$root/data/backup_label"
	touch "$root/data/standby.signal"
	# what the primary had set for its own standbys is not this server's business
	sed -i '/^synchronized_standby_slots/d' "$root/data/postgresql.auto.conf"
	cat >>"$root/data/postgresql.conf" <<CONF
# standby of 127.0.0.1:$pport
port = $port
unix_socket_directories = '$root'
primary_conninfo = 'host=$phost port=$pport user=postgres dbname=postgres'
primary_slot_name = '$slot'
hot_standby = on
hot_standby_feedback = on
CONF
	if [ "$major" -ge 17 ]; then
		echo "sync_replication_slots = on" >>"$root/data/postgresql.conf"
	fi
	if [ "$(id -u)" -eq 0 ]; then
		chown -R postgres: "$root"
	fi
	if ! port=$(pg_start "$root" "$port"); then
		stop
		exit 1
	fi
	sed -i "s/^OBX_PGPORT=.*/OBX_PGPORT=$port/" "$state/env"
	# streaming: the walreceiver holds the physical slot
	for _ in $(seq 1 300); do
		if [ "$(pg_psql "${P[@]}" -At -c "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'")" = t ]; then
			break
		fi
		sleep 0.1
	done
	if [ "$(pg_psql "${P[@]}" -At -c "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'")" != t ]; then
		echo "pgstack: the standby does not stream from $phost:$pport" >&2
		cat "$root/server.log" >&2 || true
		stop
		exit 1
	fi
	if [ "$major" -ge 17 ]; then
		set_standby_slots "$phost" "$pport" "$slot" ""
	fi
	echo "pgstack: standby of 127.0.0.1:$pport on 127.0.0.1:$port (slot $slot), data $root/data"
}

# pg_ctl ARGS on the server of STATEDIR
ctl() {
	[ -f "$state/env" ] || { echo "pgstack: no cluster in $state" >&2; exit 1; }
	"${as_pg[@]}" "$(envval "$state" OBX_PGSERVERBIN)/pg_ctl" -D "$(envval "$state" OBX_PGDATA)" "$@"
}

case "$cmd" in
start) start ;;
stop) stop ;;
standby) [ -n "$extra" ] || usage; standby "$cmd" "$state" "$extra" ;;
promote) ctl -w -t 60 promote >/dev/null ;;
stop-immediate) ctl -m immediate -w stop >/dev/null ;;
*) usage ;;
esac
