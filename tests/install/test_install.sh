#!/usr/bin/env bash
# cmake --install puts liboutbox where pkg-config finds it, and a program
# built only from `pkg-config --cflags --libs liboutbox` links and runs
# (shared and static), along with the daemon, sql/ and the manual page.
set -uo pipefail
build=${1:?build dir}
extra_cflags=${2:-}
prefix=$(mktemp -d /tmp/obx-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
run() { local d=$1; shift; if out=$("$@" 2>&1); then ok "$d"; else not_ok "$d: $out"; fi; }

run "cmake --install" cmake --install "$build" --prefix "$prefix"
libdir=$(dirname "$(find "$prefix" -name liboutbox.pc | head -1)")/..
run "liboutbox.pc installed" test -f "$libdir/pkgconfig/liboutbox.pc"
run "header installed" test -f "$prefix/include/outbox.h"
run "liboutbox installed, shared and static" test -f "$libdir/liboutbox.so.0" -a -f "$libdir/liboutbox.a"
run "daemon installed" test -x "$prefix/bin/outboxd"
run "sql installed" test -f "$prefix/share/outboxd/sql/007_inbox.sql"
run "man page installed" test -f "$prefix/share/man/man8/outboxd.8"
cat >"$prefix/hello.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <outbox.h>
int main(void)
{
	struct outbox_writer_config cfg;

	outbox_writer_config_init(&cfg);
	printf("liboutbox %s %s\n", outbox_version(), cfg.table);
	return strcmp(outbox_version(), "0.1.0") != 0;
}
C
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# the librdkafka the build used (CMakeLists.txt: OBX_RDKAFKA_PREFIX, or the
# system's): its .pc file resolves liboutbox's "Requires: rdkafka", and a
# program linked with it carries its directory, as outboxd does
rkdir=$(sed -n 's/^RDKAFKA_LIBDIR:INTERNAL=//p' "$build/CMakeCache.txt")
if [ -n "$rkdir" ]; then
	PKG_CONFIG_PATH="$PKG_CONFIG_PATH:$rkdir/pkgconfig"
	extra_cflags="$extra_cflags -Wl,-rpath,$rkdir"
fi
# shellcheck disable=SC2046,SC2086
run "a program builds from pkg-config alone (shared)" \
	cc $extra_cflags -o "$prefix/hello" "$prefix/hello.c" $(pkg-config --cflags --libs liboutbox)
run "and runs" env LD_LIBRARY_PATH="$libdir" "$prefix/hello"
# static liboutbox; its dependencies stay shared (Debian ships no static libpq)
# shellcheck disable=SC2046,SC2086
run "a program links liboutbox statically" \
	cc $extra_cflags -o "$prefix/hello-static" "$prefix/hello.c" $(pkg-config --cflags liboutbox) \
	"$libdir/liboutbox.a" $(pkg-config --libs libpq rdkafka jansson)
run "and runs without the shared library" "$prefix/hello-static"

echo "1..$n"
[ "$failed" -eq 0 ]
