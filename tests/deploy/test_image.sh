#!/usr/bin/env bash
# The image of deploy/Containerfile, made and run without a container engine:
# scripts/image-rootfs.py replays the file (debootstrap of Debian 13, then its
# steps in a chroot; the layers before each stage's first COPY are kept in
# /var/cache/outboxd-deps/rootfs-trixie), then in the image's file system, as
# its USER and through its ENTRYPOINT and CMD: every library of outboxd
# resolves from the runtime packages alone, no compiler or -dev package is
# there, `--version` names librdkafka 2.8, and against the test stack (the
# ctest fixture's PostgreSQL, a test broker) one relay publishes 100 rows
# into Kafka, the slot confirms past them, SIGTERM ends it with 0 and `check`
# passes.  A chroot shares the host's network, so loopback reaches both.
# Needs root (debootstrap, chroot): otherwise exit 77, which ctest reports as
# skipped.  2 to 2.5 minutes with an empty cache, 30 s with it (docs/guide/kubernetes.md).
set -uo pipefail
src=${OBX_SOURCE_DIR:?}
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
bail() { not_ok "$1"; echo "1..$n"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
	echo "# skipped: making the image's file system needs root (debootstrap, chroot)"
	exit 77
fi

tmp=$(mktemp -d /tmp/obx-image.XXXXXX)
img=$tmp/image
outboxd_pid=
broker_pid=
db=
slot=
# shellcheck disable=SC1090
. "${OBX_STACK_ENV:?}"
psql=("$OBX_PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER")
cleanup() {
	if [ -n "$outboxd_pid" ]; then
		kill -KILL "$outboxd_pid" 2>/dev/null
		wait "$outboxd_pid" 2>/dev/null
	fi
	exec 9>&- 2>/dev/null # end of stdin stops the broker
	[ -n "$broker_pid" ] && wait "$broker_pid" 2>/dev/null
	if [ -n "$db" ]; then
		"${psql[@]}" -d postgres -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
			WHERE slot_name = '$slot'" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

t0=$(date +%s)
if ! python3 "$src/scripts/image-rootfs.py" --context "$src" --containerfile "$src/deploy/Containerfile" "$img" \
	>"$tmp/image.log" 2>&1; then
	tail -30 "$tmp/image.log"
	bail "the image's file system is made from deploy/Containerfile"
fi
sed 's/^/# /' "$tmp/image.log"
ok "the image's file system is made from deploy/Containerfile ($(($(date +%s) - t0)) s)"

# the image's configuration, as image-rootfs.py read it from the Containerfile
cfg() { python3 -c 'import json, sys; v = json.load(open(sys.argv[1]))[sys.argv[2]]; print("\n".join(v) if isinstance(v, list) else v)' "$img.json" "$1"; }
user=$(cfg user)
mapfile -t entrypoint < <(cfg entrypoint)
mapfile -t cmd < <(cfg cmd)
# a command in the image as a container engine runs it: its user, its PATH, nothing of this
# shell; env and chroot exec, so a background one's $! is outboxd itself
in_image=(env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ HOSTNAME=outboxd
	chroot --userspec="$user" "$img" "${entrypoint[@]}")

if grep -q '^13\.' "$img/etc/debian_version" && [ "$user" = 10001:10001 ] &&
	[ "${entrypoint[*]}" = /usr/local/bin/outboxd ]; then
	ok "Debian $(cat "$img/etc/debian_version"), user $user, entrypoint ${entrypoint[*]}"
else
	not_ok "Debian 13, user 10001:10001, entrypoint /usr/local/bin/outboxd (have $(cat "$img/etc/debian_version"), '$user', '${entrypoint[*]}')"
fi
libs=$(chroot "$img" ldd /usr/local/bin/outboxd 2>&1)
if [ -n "$libs" ] && ! grep -q 'not found' <<<"$libs" && grep -q 'librdkafka.so.1 => /lib/x86_64-linux-gnu/' <<<"$libs"; then
	ok "every library of outboxd resolves in the runtime image, librdkafka from librdkafka1 $(chroot "$img" dpkg-query -W -f='${Version}' librdkafka1)"
else
	not_ok "every library of outboxd resolves in the runtime image: $libs"
fi
devs=$(chroot "$img" dpkg-query -W -f='${Package}\n' |
	grep -E -- '-dev$|^(gcc|g\+\+|cpp)(-[0-9]+)?$|^(binutils|cmake|make|pkgconf|build-essential)$' | tr '\n' ' ')
if [ -z "$devs" ]; then
	ok "the runtime image has no compiler, build tool or -dev package"
else
	not_ok "the runtime image has no compiler, build tool or -dev package: $devs"
fi
version=$("${in_image[@]}" --version 2>&1)
if grep -qE '^outboxd [0-9.]+ \(librdkafka 2\.8\.[0-9]+' <<<"$version"; then
	ok "as user $user: $version"
else
	not_ok "outboxd --version names librdkafka 2.8 (have: $version)"
fi

# ---- one relay against the test stack, the image's own sql/ files for the schema ----
db=obx_image_$$
slot=obx_image_$$
"${psql[@]}" -d postgres -c "CREATE DATABASE $db" >/dev/null || bail "create database $db"
sqldir=$img/usr/share/outboxd/sql
if "${psql[@]}" -d "$db" -f "$sqldir/001_outbox.sql" -f "$sqldir/002_publication.sql" >/dev/null; then
	ok "the image's /usr/share/outboxd/sql/001 and 002 make the outbox and its publication"
else
	bail "the image's /usr/share/outboxd/sql/001 and 002 make the outbox and its publication"
fi

mkfifo "$tmp/broker.in"
"${OBX_TESTBROKER:?}" <"$tmp/broker.in" >"$tmp/broker.out" 2>&1 &
broker_pid=$!
exec 9>"$tmp/broker.in"
for _ in $(seq 1 100); do grep -q '^bootstrap.servers=' "$tmp/broker.out" && break; sleep 0.1; done
bootstrap=$(sed -n 's/^bootstrap.servers=//p' "$tmp/broker.out" | head -1)
[ -n "$bootstrap" ] || bail "the test broker starts ($(cat "$tmp/broker.out"))"
metrics_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# the configuration where the image's CMD reads it (a ConfigMap's mount in Kubernetes)
conf=
for ((i = 0; i < ${#cmd[@]}; i++)); do [ "${cmd[$i]}" = -c ] && conf=${cmd[$((i + 1))]}; done
[ -n "$conf" ] || bail "the image's CMD names a configuration file (-c FILE): ${cmd[*]}"
mkdir -p "$img$(dirname "$conf")"
cat >"$img$conf" <<INI
[source]
conninfo = host=$OBX_PGHOST port=$OBX_PGPORT user=$OBX_PGUSER dbname=$db
slot = $slot
status_interval = 1s
[kafka]
bootstrap.servers = $bootstrap
linger.ms = 5
[metrics]
listen = 127.0.0.1:$metrics_port
[log]
format = text
INI
chmod 644 "$img$conf"

# the image's CMD, as `docker run IMAGE` would run it
"${in_image[@]}" "${cmd[@]}" >"$tmp/outboxd.log" 2>&1 &
outboxd_pid=$!
for _ in $(seq 1 300); do
	grep -q "streaming from slot $slot" "$tmp/outboxd.log" && break
	kill -0 "$outboxd_pid" 2>/dev/null || break
	sleep 0.1
done
if grep -q "streaming from slot $slot" "$tmp/outboxd.log"; then
	ok "the image's CMD (${cmd[*]}) streams from slot $slot"
else
	sed 's/^/# outboxd| /' "$tmp/outboxd.log"
	bail "the image's CMD (${cmd[*]}) streams from slot $slot"
fi

rows=100
"${psql[@]}" -d "$db" -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
	SELECT 'image', 'order-' || g, 'created', jsonb_build_object('n', g) FROM generate_series(1, $rows) g" >/dev/null
lsn=$("${psql[@]}" -d "$db" -At -c "SELECT pg_current_wal_lsn()")
keys=0
for _ in $(seq 1 30); do
	keys=$(timeout 20 kcat -q -b "$bootstrap" -C -t outbox.event.image -o beginning -e -f '%k\n' 2>/dev/null | sort -u | grep -c '^order-')
	[ "$keys" -ge "$rows" ] && break
	sleep 0.5
done
if [ "$keys" -eq "$rows" ]; then
	ok "$rows rows reach Kafka (topic outbox.event.image, $rows distinct keys)"
else
	not_ok "$rows rows reach Kafka (topic outbox.event.image: $keys distinct keys)"
fi
confirmed=f
for _ in $(seq 1 100); do
	confirmed=$("${psql[@]}" -d "$db" -At -c "SELECT coalesce((SELECT confirmed_flush_lsn >= '$lsn'
		FROM pg_replication_slots WHERE slot_name = '$slot'), false)")
	[ "$confirmed" = t ] && break
	sleep 0.2
done
if [ "$confirmed" = t ]; then
	ok "the slot confirms past the rows ($lsn)"
else
	not_ok "the slot confirms past the rows ($lsn): $("${psql[@]}" -d "$db" -At -c "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '$slot'")"
fi

kill -TERM "$outboxd_pid"
# the drain has 30 s (the Deployment's grace period covers it); after 60 s it is killed
for _ in $(seq 1 600); do kill -0 "$outboxd_pid" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$outboxd_pid" 2>/dev/null
wait "$outboxd_pid"
rc=$?
outboxd_pid=
if [ "$rc" -eq 0 ]; then
	ok "SIGTERM: outboxd exits 0"
else
	sed 's/^/# outboxd| /' "$tmp/outboxd.log"
	not_ok "SIGTERM: outboxd exits 0 (exit $rc)"
fi
if out=$("${in_image[@]}" check -c "$conf" 2>&1); then
	ok "outboxd check -c $conf in the image passes"
else
	not_ok "outboxd check -c $conf in the image passes: $out"
fi

echo "1..$n"
[ "$failed" -eq 0 ]
