#!/usr/bin/env bash
# docs/internals/testing.md names test files and test functions: every
# `tests/...` path it names must exist, and every `test_...` name that
# follows a C file's path on the same line of a table must be a function
# defined in that file (a line "test_name(" at the start of a line).
# Usage: test_testing_doc.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: test_testing_doc.sh SOURCE_DIR}
doc=$src/docs/internals/testing.md
[ -f "$doc" ] || { echo "test_testing_doc: no $doc" >&2; exit 1; }
bad=0
paths=0
cases=0
while IFS= read -r line; do
	file=
	# the backquoted words of the line, in order
	while IFS= read -r word; do
		case "$word" in
		tests/*)
			paths=$((paths + 1))
			file=$word
			if [ ! -e "$src/$file" ]; then
				echo "testing.md names $file, which does not exist" >&2
				bad=1
				file=
			fi
			;;
		test_*)
			case "$file" in
			*.c) ;;
			*) continue ;;
			esac
			cases=$((cases + 1))
			if ! grep -q "^$word(" "$src/$file"; then
				echo "testing.md names $word in $file, which defines no such function" >&2
				bad=1
			fi
			;;
		esac
	done < <(grep -o '`[^`]*`' <<<"$line" | tr -d '`')
done < <(grep '^|' "$doc")
# the prose outside the tables: paths only
while IFS= read -r p; do
	[ -e "$src/$p" ] || { echo "testing.md names $p, which does not exist" >&2; bad=1; }
done < <(grep -v '^|' "$doc" | grep -o '`tests/[^` ]*`' | tr -d '`' | sort -u)
if [ "$paths" -lt 20 ] || [ "$cases" -lt 30 ]; then
	echo "testing.md: only $paths paths and $cases test functions found in its tables" >&2
	bad=1
fi
[ "$bad" -eq 0 ] && echo "testing.md: $paths paths and $cases test functions named, all present"
exit "$bad"
