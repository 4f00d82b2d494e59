#!/usr/bin/env bash
# Builds the librdkafka the tests, the demo and the benchmarks run on:
# Debian 13's source package of librdkafka 2.8.0, built once into a
# versioned prefix outside the checkout and reused from then on.
# CMakeLists.txt finds that prefix first (OBX_RDKAFKA_PREFIX); without it
# outboxd builds against Debian 12's librdkafka-dev (2.0.2).
#
#   OBX_DEPS_CACHE       where built dependencies live (/var/cache/outboxd-deps)
#   OBX_RDKAFKA_PREFIX   the prefix itself ($OBX_DEPS_CACHE/librdkafka-2.8.0)
#
# The source comes through apt with a configuration of its own (a
# sources.list holding one deb-src line for trixie, its own lists, cache
# and state), so the system's apt sources stay as they are.  Debian 12
# packages supply the build dependencies (scripts/install-deps.sh).
# A stamp file in the prefix marks a finished build; with it present this
# script only checks the features and exits.
set -euo pipefail

version=2.8.0
suite=trixie
cache=${OBX_DEPS_CACHE:-/var/cache/outboxd-deps}
prefix=${OBX_RDKAFKA_PREFIX:-$cache/librdkafka-$version}
stamp=$prefix/.outboxd-built
# what outboxd and its tests use: SCRAM (Kafka 4 brokers), OIDC tokens,
# TLS and the compression codecs
features=(ssl sasl_scram sasl_oauthbearer oidc zstd lz4)

check_features() {
	local have f missing=()
	# the .pc files carry no feature list; the library itself reports it
	have=$(feature_list)
	for f in "${features[@]}"; do
		case ",$have," in
		*",$f,"*) ;;
		*) missing+=("$f") ;;
		esac
	done
	if [ "${#missing[@]}" -gt 0 ]; then
		echo "build-librdkafka: $prefix lacks ${missing[*]} (builtin.features: $have)" >&2
		return 1
	fi
}

# builtin.features of the library in the prefix, asked of the library
feature_list() {
	local dir
	dir=$(mktemp -d)
	cat >"$dir/f.c" <<'EOF'
#include <stdio.h>
#include <librdkafka/rdkafka.h>
int main(void)
{
	char v[512];
	size_t n = sizeof(v);
	rd_kafka_conf_t *c = rd_kafka_conf_new();
	if (rd_kafka_conf_get(c, "builtin.features", v, &n) != RD_KAFKA_CONF_OK)
		return 1;
	printf("%s %s\n", rd_kafka_version_str(), v);
	rd_kafka_conf_destroy(c);
	return 0;
}
EOF
	cc -o "$dir/f" "$dir/f.c" -I"$prefix/include" -L"$prefix/lib" -Wl,-rpath,"$prefix/lib" -lrdkafka
	local out
	out=$("$dir/f")
	rm -rf "$dir"
	if [ "${out%% *}" != "$version" ]; then
		echo "build-librdkafka: $prefix holds librdkafka ${out%% *}, not $version" >&2
		return 1
	fi
	echo "${out#* }"
}

if [ -e "$stamp" ]; then
	check_features
	echo "build-librdkafka: librdkafka $version in $prefix (built $(cat "$stamp"))"
	exit 0
fi

if [ "$(id -u)" -ne 0 ] && ! { mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ]; }; then
	echo "build-librdkafka: cannot write $cache; run as root or set OBX_DEPS_CACHE" >&2
	exit 1
fi
mkdir -p "$cache"

t0=$(date +%s)
work=$(mktemp -d "$cache/.build-librdkafka.XXXXXX")
trap 'rm -rf "$work"' EXIT

# apt with a configuration of its own: one deb-src line, lists and
# archives under $work, no sources.list.d, and the system's keyring
apt=$work/apt
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$apt/preferences.d"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
	>"$apt/sources.list"
aptopts=(
	-o Dir::Etc::SourceList="$apt/sources.list"
	-o Dir::Etc::SourceParts="$apt/sources.list.d"
	-o Dir::Etc::Preferences="$apt/preferences"
	-o Dir::Etc::PreferencesParts="$apt/preferences.d"
	-o Dir::State::Lists="$apt/lists"
	-o Dir::Cache="$apt/cache"
	-o Dir::Cache::pkgcache=""
	-o Dir::Cache::srcpkgcache=""
	# the private lists are written by this user, so downloads need no sandbox user
	-o APT::Sandbox::User="$(id -un)"
)
echo "build-librdkafka: fetching Debian $suite's librdkafka source"
apt-get "${aptopts[@]}" -qq update
src=$work/src
mkdir -p "$src"
(cd "$src" && apt-get "${aptopts[@]}" -qq source "librdkafka/$suite" >/dev/null)
dsc=$(ls "$src"/librdkafka_*.dsc)
debversion=$(sed -n 's/^Version: *//p' "$dsc")
case "$debversion" in
"$version"-*) ;;
*)
	echo "build-librdkafka: $suite carries librdkafka $debversion, not $version" >&2
	exit 1
	;;
esac
tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name "librdkafka-*")

echo "build-librdkafka: building librdkafka $debversion into $prefix"
rm -rf "$prefix"
cd "$tree"
# no --install-deps: every dependency is a Debian 12 package; curl gives
# the OIDC token refresh (sasl.oauthbearer.method=oidc)
./configure --prefix="$prefix" --enable-ssl --enable-sasl --enable-zstd \
	--enable-lz4-ext --enable-zlib --enable-curl >"$work/configure.log" 2>&1 || {
	tail -40 "$work/configure.log" >&2
	exit 1
}
make -j "$(nproc)" libs >"$work/make.log" 2>&1 || {
	tail -40 "$work/make.log" >&2
	exit 1
}
make install-subdirs >"$work/install.log" 2>&1 || {
	tail -40 "$work/install.log" >&2
	exit 1
}
check_features
echo "$debversion from Debian $suite, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - t0)) s" >"$stamp"
echo "build-librdkafka: librdkafka $debversion in $prefix, $(($(date +%s) - t0)) s"
