#!/usr/bin/env bash
# Regenerates docs/reference/configuration.md from the configuration table
# (src/core/config_table.c) through `outboxd config --reference`.
# usage: scripts/gen-config-doc.sh [OUTBOXD]
#   OUTBOXD: a built outboxd; without it, build/outboxd is built first.
# The unit test unit.config_doc_current fails while the committed file differs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ]; then
	bin=$1
else
	[ -d build ] || cmake -S . -B build >/dev/null
	cmake --build build --target outboxd >/dev/null
	bin=build/outboxd
fi
out=docs/reference/configuration.md
"$bin" config --reference >"$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out"
