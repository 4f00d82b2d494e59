#!/bin/sh
# docs/reference/configuration.md is generated from the configuration table
# (src/core/config_table.c): fails, with the command that regenerates it,
# while the committed file differs from what the table gives.
#
# usage: config_doc_current.sh OUTBOXD SOURCE_DIR
set -eu
bin=${1:?outboxd}
top=${2:?source dir}
doc=$top/docs/reference/configuration.md
tmp=$(mktemp /tmp/obx-config-doc.XXXXXX)
trap 'rm -f "$tmp"' EXIT
"$bin" config --reference >"$tmp"
if ! diff -u "$doc" "$tmp"; then
	echo "config_doc_current: docs/reference/configuration.md is not what the table in" \
		"src/core/config_table.c generates: run scripts/gen-config-doc.sh and commit the result" >&2
	exit 1
fi
echo "config_doc_current: docs/reference/configuration.md matches the table"
