#!/usr/bin/env bash
# Fetches, once, the Apache Kafka broker the real-broker tests run against:
# Maven copies the artifacts pinned in tests/stack/kafka/pom.xml (the broker
# and its runtime dependencies, plus a logging binding) from Maven Central
# into a versioned directory of the dependency cache, reused from then on.
# Prints that directory's libs folder (the broker's classpath).
#
#   OBX_DEPS_CACHE   where fetched dependencies live (/var/cache/outboxd-deps)
#
# Needs Java 17 and Maven (scripts/install-deps.sh).  About 45 MB, 20 s the
# first time.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
pom=$here/tests/stack/kafka/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
cache=${OBX_DEPS_CACHE:-/var/cache/outboxd-deps}
dir=$cache/kafka-$version
stamp=$dir/.outboxd-fetched

if [ -z "$version" ]; then
	echo "fetch-kafka: $pom names no kafka.version" >&2
	exit 1
fi
# a new pom (another log binding, say) fetches again
if [ -e "$stamp" ] && cmp -s "$stamp" "$pom"; then
	echo "$dir/libs"
	exit 0
fi
for tool in java mvn; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "fetch-kafka: $tool is missing (scripts/install-deps.sh installs it)" >&2
		exit 1
	fi
done
mkdir -p "$dir"
rm -rf "$dir/libs.new"
if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
	-DoutputDirectory="$dir/libs.new" >"$dir/mvn.log" 2>&1; then
	echo "fetch-kafka: Maven could not fetch Apache Kafka $version; its output:" >&2
	tail -n 20 "$dir/mvn.log" >&2
	exit 1
fi
if ! ls "$dir/libs.new"/kafka_2.13-"$version".jar >/dev/null 2>&1; then
	echo "fetch-kafka: Maven finished but $dir/libs.new has no kafka_2.13-$version.jar" >&2
	exit 1
fi
rm -rf "$dir/libs"
mv "$dir/libs.new" "$dir/libs"
cp "$pom" "$stamp"
echo "fetch-kafka: Apache Kafka $version, $(ls "$dir/libs" | wc -l) jars in $dir/libs" >&2
echo "$dir/libs"
