#!/bin/sh
# The pure core (libobx_core.a) may call jansson, libbsd and libc's string,
# memory and formatting functions (a memory stream counts as memory), but
# nothing that reaches outside the process: no libpq, librdkafka or inih, no
# files, sockets, clocks, environment or process control.  Fails naming the
# calls that would.
#
# The library is every file of src/core/ (CMakeLists.txt globs the folder),
# and a file there, or a header of include/obx/core/, includes only the
# system's headers and include/obx/core/: never libpq, librdkafka, inih or a
# header of another layer.  Only the core and the unit tests include
# relaycore_int.h, the relay core's private state.
#
# usage: core_is_pure.sh NM LIBRARY SOURCE_DIR
set -eu
nm=${1:?nm}
lib=${2:?library}
top=${3:?source dir}

# every include of the core that is neither <system> nor "obx/core/..."
incl=$(grep -Hn '^[[:space:]]*#[[:space:]]*include' "$top"/src/core/*.c "$top"/include/obx/core/*.h |
	grep -Ev '#[[:space:]]*include[[:space:]]*"obx/core/[a-z_]+\.h"' |
	grep -E '"|<(libpq-fe|libpq/.*|librdkafka/.*|ini|microhttpd|pthread|unistd|sys/.*|fcntl|dirent|signal|netinet/.*|arpa/.*)\.h>' || true)
if [ -n "$incl" ]; then
	echo "core_is_pure: the core includes what a pure module must not:" >&2
	printf '%s\n' "$incl" >&2
	exit 1
fi

# the relay core's state (relaycore_int.h) is the core's own: the loops read
# it through relaycore.h (obx_core_stats() and the accessors); only the core
# and the unit tests include it
leak=$(grep -rln '#[[:space:]]*include[[:space:]]*"obx/core/relaycore_int\.h"' "$top"/src "$top"/include "$top"/bench |
	grep -v "^$top/src/core/" | grep -v "^$top/include/obx/core/relaycore_int\.h$" || true)
if [ -n "$leak" ]; then
	echo "core_is_pure: only src/core/ and the unit tests may include relaycore_int.h:" >&2
	printf '%s\n' "$leak" >&2
	exit 1
fi

forbidden='^(PQ.*|pq.*|lo_.*|rd_kafka_.*|ini_.*'
forbidden="$forbidden|open|open64|openat|creat|fopen|fopen64|fdopen|freopen|opendir|stat|fstat|lstat"
forbidden="$forbidden|read|write|pread|pwrite|readv|writev|fread|fwrite|fgets|fgetc|getc|feof|fputs|fputc"
forbidden="$forbidden|puts|putchar|printf|vprintf|perror|fflush|unlink|rename|mkdir|remove"
forbidden="$forbidden|socket|connect|accept|accept4|bind|listen|getaddrinfo|poll|ppoll|select|epoll_.*"
forbidden="$forbidden|recv|recvfrom|recvmsg|send|sendto|sendmsg|pipe|pipe2|dup|dup2|close|ioctl|fcntl"
forbidden="$forbidden|clock_gettime|gettimeofday|time|sleep|usleep|nanosleep|getenv|secure_getenv|setenv"
forbidden="$forbidden|syslog|stdin|stdout|stderr|exit|_exit|abort|kill|raise|signal|sigaction|system|popen|fork|exec.*)$"

symbols=$("$nm" -u --format=just-symbols "$lib" | sort -u)
bad=$(printf '%s\n' "$symbols" | grep -E "$forbidden" || true)
if [ -n "$bad" ]; then
	echo "core_is_pure: $lib calls what a pure module must not:" $bad >&2
	exit 1
fi
echo "core_is_pure: $(printf '%s\n' "$symbols" | grep -c .) undefined symbols, none forbidden"
