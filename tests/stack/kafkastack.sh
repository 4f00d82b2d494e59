#!/usr/bin/env bash
# kafkastack.sh start|stop|kill|restart STATEDIR
#
# A throwaway single-node Apache Kafka broker (KRaft: broker and controller
# in one process) for the real-broker tests, on free loopback ports, its
# heap bounded to 512 MiB.  The broker comes from Maven Central through
# scripts/fetch-kafka.sh (the version pinned in tests/stack/kafka/pom.xml).
#
# "start" makes STATEDIR, a throwaway CA and certificates, formats a fresh
# log directory (a random cluster id, SCRAM credentials at format time),
# starts the broker, waits until it serves, and writes STATEDIR/env for the
# tests:
#   OBX_KAFKA_PLAINTEXT      127.0.0.1:PORT, no TLS, no SASL
#   OBX_KAFKA_SSL            localhost:PORT, TLS (certificate for localhost and 127.0.0.1)
#   OBX_KAFKA_SSL_WRONG_NAME localhost:PORT, TLS with a certificate for another host name
#   OBX_KAFKA_SASL_SSL       localhost:PORT, TLS + SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN
#   OBX_KAFKA_SASL_PLAINTEXT 127.0.0.1:PORT, SASL (PLAIN or SCRAM) without TLS
#   OBX_KAFKA_CA             the CA's certificate (PEM), for ssl.ca.location
#   OBX_KAFKA_OTHER_CA       a CA that signed nothing the broker shows
#   OBX_KAFKA_USER / OBX_KAFKA_PASSWORD_FILE   a SASL user with no ACL (tests grant what they need)
#   OBX_KAFKA_ADMIN / OBX_KAFKA_ADMIN_PASSWORD_FILE a SASL super user
#   OBX_KAFKA_VERSION, OBX_KAFKA_PID, OBX_KAFKA_ROOT
# The authorizer is on with allow.everyone.if.no.acl.found=false.  The broker
# reaches its own controller as ANONYMOUS, which is therefore a super user:
# PLAINTEXT and SSL clients may do anything, a SASL user only what its ACLs
# allow.  Topics are created automatically on first use.
#
# "kill" kills the broker with SIGKILL and keeps its data (a crash);
# "restart" starts it again on the same data and waits until it serves (a
# short broker session, so a killed node is back in seconds); "stop" stops
# it by its pid (SIGTERM, then SIGKILL) and removes STATEDIR.
set -euo pipefail

cmd=${1:-}
state=${2:-}
if [ -z "$cmd" ] || [ -z "$state" ]; then
	echo "usage: kafkastack.sh start|stop|kill|restart STATEDIR" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")/../.." && pwd)

free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	echo "kafkastack: no free port found" >&2
	return 1
}

envval() {
	(
		# shellcheck disable=SC1091
		. "$state/env"
		eval "printf '%s' \"\${$1:-}\""
	)
}

# make_certs DIR: a CA, a broker certificate for localhost/127.0.0.1 and one
# for another name, each as a PKCS12 keystore; a second CA that signed nothing
make_certs() {
	local d=$1 pass=$2
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=outboxd test CA" \
		-keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
	openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=outboxd other CA" \
		-keyout "$d/other-ca.key" -out "$d/other-ca.pem" 2>/dev/null
	local name san
	for name in broker wrong-name; do
		if [ "$name" = broker ]; then
			san="subjectAltName=DNS:localhost,IP:127.0.0.1"
		else
			san="subjectAltName=DNS:broker.invalid"
		fi
		openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" \
			-keyout "$d/$name.key" -out "$d/$name.csr" 2>/dev/null
		openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
			-days 2 -extfile <(echo "$san") -out "$d/$name.pem" 2>/dev/null
		openssl pkcs12 -export -in "$d/$name.pem" -inkey "$d/$name.key" -name "$name" \
			-passout "pass:$pass" -out "$d/$name.p12"
	done
}

# wait_started: until the broker logs that it serves, it dies, or 90 s pass
wait_started() {
	local pid=$1 log=$2 before=$3 i
	for i in $(seq 1 900); do
		if [ "$(grep -c 'Kafka Server started' "$log" 2>/dev/null || true)" -gt "$before" ]; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "kafkastack: the broker exited; the end of $log:" >&2
			tail -n 30 "$log" >&2
			return 1
		fi
		sleep 0.1
	done
	echo "kafkastack: the broker did not start within 90 s; the end of $log:" >&2
	tail -n 30 "$log" >&2
	return 1
}

launch() {
	local root=$1 libs before
	libs=$(envval OBX_KAFKA_LIBS)
	before=$(grep -c 'Kafka Server started' "$root/broker.log" 2>/dev/null || true)
	# its own session, so a test's signal to its process group never reaches it
	setsid java -Xms128m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$root/log4j2.properties" \
		-cp "$libs/*" kafka.Kafka "$root/server.properties" >>"$root/broker.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$root/broker.pid"
	sed -i "s/^OBX_KAFKA_PID=.*/OBX_KAFKA_PID=$pid/" "$state/env"
	wait_started "$pid" "$root/broker.log" "${before:-0}"
}

start() {
	local libs root t0 cluster pass user_pass admin_pass
	local p_plain p_ssl p_wrong p_sasl_ssl p_sasl_plain p_ctl
	t0=$(date +%s.%N)
	libs=$(bash "$here/scripts/fetch-kafka.sh")
	mkdir -p "$state"
	root=$(mktemp -d /tmp/obx-kafka.XXXXXX)
	chmod 755 "$root"
	mkdir "$root/data"
	pass=$(openssl rand -hex 12)
	user_pass=$(openssl rand -hex 12)
	admin_pass=$(openssl rand -hex 12)
	printf '%s' "$user_pass" >"$root/user.password"
	printf '%s' "$admin_pass" >"$root/admin.password"
	make_certs "$root" "$pass"
	p_plain=$(free_port)
	p_ssl=$(free_port)
	p_wrong=$(free_port)
	p_sasl_ssl=$(free_port)
	p_sasl_plain=$(free_port)
	p_ctl=$(free_port)
	local plain_users="user_admin=\"$admin_pass\" user_relay=\"$user_pass\""
	cat >"$root/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$p_ctl
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$p_plain,SSL://127.0.0.1:$p_ssl,WRONGNAME://127.0.0.1:$p_wrong,SASL_SSL://127.0.0.1:$p_sasl_ssl,SASL_PLAINTEXT://127.0.0.1:$p_sasl_plain,CONTROLLER://127.0.0.1:$p_ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$p_plain,SSL://localhost:$p_ssl,WRONGNAME://localhost:$p_wrong,SASL_SSL://localhost:$p_sasl_ssl,SASL_PLAINTEXT://127.0.0.1:$p_sasl_plain
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,WRONGNAME:SSL,SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$root/data
num.partitions=3
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=16777216
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=1000
ssl.keystore.type=PKCS12
ssl.keystore.location=$root/broker.p12
ssl.keystore.password=$pass
ssl.key.password=$pass
listener.name.wrongname.ssl.keystore.type=PKCS12
listener.name.wrongname.ssl.keystore.location=$root/wrong-name.p12
listener.name.wrongname.ssl.keystore.password=$pass
listener.name.wrongname.ssl.key.password=$pass
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $plain_users;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required $plain_users;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS;User:admin
PROPS
	cat >"$root/log4j2.properties" <<'LOG'
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
LOG
	cat >"$state/env" <<ENV
OBX_KAFKA_ROOT=$root
OBX_KAFKA_LIBS=$libs
OBX_KAFKA_VERSION=$(basename "$(dirname "$libs")" | sed 's/^kafka-//')
OBX_KAFKA_PID=
OBX_KAFKA_PLAINTEXT=127.0.0.1:$p_plain
OBX_KAFKA_SSL=localhost:$p_ssl
OBX_KAFKA_SSL_WRONG_NAME=localhost:$p_wrong
OBX_KAFKA_SASL_SSL=localhost:$p_sasl_ssl
OBX_KAFKA_SASL_PLAINTEXT=127.0.0.1:$p_sasl_plain
OBX_KAFKA_CA=$root/ca.pem
OBX_KAFKA_OTHER_CA=$root/other-ca.pem
OBX_KAFKA_USER=relay
OBX_KAFKA_PASSWORD_FILE=$root/user.password
OBX_KAFKA_ADMIN=admin
OBX_KAFKA_ADMIN_PASSWORD_FILE=$root/admin.password
ENV
	cluster=$(java -cp "$libs/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
	local m scram=()
	for m in SCRAM-SHA-512 SCRAM-SHA-256; do
		scram+=(--add-scram "$m=[name=relay,password=$user_pass]" --add-scram "$m=[name=admin,password=$admin_pass]")
	done
	if ! java -cp "$libs/*" -Dlog4j2.configurationFile="$root/log4j2.properties" kafka.tools.StorageTool format \
		-t "$cluster" -c "$root/server.properties" "${scram[@]}" >"$root/format.log" 2>&1; then
		echo "kafkastack: formatting the log directory failed:" >&2
		cat "$root/format.log" >&2
		exit 1
	fi
	launch "$root"
	echo "kafkastack: Apache Kafka $(envval OBX_KAFKA_VERSION) on 127.0.0.1 (PLAINTEXT $p_plain, SSL $p_ssl," \
		"SASL_SSL $p_sasl_ssl, SASL_PLAINTEXT $p_sasl_plain), data $root/data," \
		"ready in $(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)") s"
}

stop_pid() {
	local pid=$1 i
	[ -n "$pid" ] || return 0
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 300); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	sleep 0.2
}

case "$cmd" in
start) start ;;
kill)
	pid=$(envval OBX_KAFKA_PID)
	kill -KILL "$pid"
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || exit 0
		sleep 0.1
	done
	echo "kafkastack: broker $pid survived SIGKILL" >&2
	exit 1
	;;
restart)
	root=$(envval OBX_KAFKA_ROOT)
	stop_pid "$(envval OBX_KAFKA_PID)"
	launch "$root"
	;;
stop)
	[ -e "$state/env" ] || exit 0
	root=$(envval OBX_KAFKA_ROOT)
	stop_pid "$(envval OBX_KAFKA_PID)"
	case "$root" in
	/tmp/obx-kafka.*) rm -rf "$root" ;;
	esac
	rm -rf "$state"
	;;
*)
	echo "kafkastack: unknown command '$cmd'" >&2
	exit 2
	;;
esac
