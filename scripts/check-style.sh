#!/usr/bin/env bash
# The style checks (STYLE.md: banned functions, the formatter).
#
#   scripts/check-style.sh           banned functions in the C files of src/ and include/:
#                                    prints file:line for each use, exits 1 if there is any
#   scripts/check-style.sh --format  clang-format-14 --dry-run --Werror over the C files of
#                                    src/, include/, tests/ and bench/ with .clang-format
#
# Banned everywhere: atoi, atol, atoll, atof, sscanf, vsscanf, sprintf, vsprintf, strcpy,
# strcat, strncpy, strncat, gets.  Use snprintf, strlcpy, strlcat (libbsd) and strtonum.
# The strto* family (strtol, strtoll, strtoul, strtoull, strtoimax, strtoumax, strtof,
# strtod, strtold) is allowed only in the parse helpers listed in STRTO_HELPERS, each of
# which checks errno and the end pointer; everything else calls strtonum or one of them.
# Comments, string literals and character literals are not searched.
set -euo pipefail
cd "$(dirname "$0")/.."

# The parse helpers that may call strto* (each checks errno and the end pointer).
STRTO_HELPERS=(
	src/core/config_value.c    # split_number(): config values with a unit suffix
	src/pg/util.c              # obx_pg_int64(), obx_pg_double(): values of a PGresult
	src/sys/procstat.c         # boot_time(), self_stat(): fields of /proc
	src/demo/order_service.c   # its COUNT argument (the demo links no libbsd)
	src/demo/billing_consumer.c # its WANT_INVOICES argument and a count(*)
)

# Files whose remaining banned calls are being replaced on another branch: their lines are
# reported but do not fail the check.  Empty this list once that work is merged.
PENDING=(
)

if [ "${1:-}" = "--format" ]; then
	mapfile -t files < <(find src include tests bench -name '*.[ch]' | LC_ALL=C sort)
	exec clang-format-14 --style=file --dry-run --Werror "${files[@]}"
elif [ $# -gt 0 ]; then
	echo "usage: scripts/check-style.sh [--format]" >&2
	exit 2
fi

mapfile -t files < <(find src include -name '*.[ch]' | LC_ALL=C sort)
STRTO_HELPERS="${STRTO_HELPERS[*]}" PENDING="${PENDING[*]}" perl -e '
	use strict;
	use warnings;
	my $banned = qr/\b(atoi|atol|atoll|atof|sscanf|vsscanf|sprintf|vsprintf|strcpy|strcat|strncpy|strncat|gets)\s*\(/;
	my $strto = qr/\b(strto(?:l|ll|ul|ull|imax|umax|f|d|ld))\s*\(/;
	my %helper = map { $_ => 1 } split " ", $ENV{STRTO_HELPERS};
	my %pending = map { $_ => 1 } split " ", $ENV{PENDING};
	my ($bad, $later) = (0, 0);
	for my $f (@ARGV) {
		open(my $fh, "<", $f) or die "$f: $!\n";
		my $s = do { local $/; <$fh> };
		close($fh);
		# blank out comments and string and character literals, keeping line breaks
		$s =~ s{(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\x27(?:\\.|[^\x27\\\n])*\x27)}
		       {(my $m = $1) =~ s/[^\n]/ /g; $m}gse;
		my $n = 0;
		for my $line (split /\n/, $s, -1) {
			$n++;
			my @hits;
			push @hits, "$1() is banned (snprintf, strlcpy, strlcat, strtonum)" while $line =~ /$banned/g;
			if (!$helper{$f}) {
				push @hits, "$1() outside the parse helpers (strtonum, or a helper in scripts/check-style.sh)"
				    while $line =~ /$strto/g;
			}
			for my $h (@hits) {
				if ($pending{$f}) {
					print "$f:$n: $h (pending)\n";
					$later++;
				} else {
					print "$f:$n: $h\n";
					$bad++;
				}
			}
		}
	}
	print "check-style: $later use(s) in files listed as PENDING\n" if $later;
	print "check-style: $bad banned use(s)\n" if $bad;
	exit($bad ? 1 : 0);
' "${files[@]}"
