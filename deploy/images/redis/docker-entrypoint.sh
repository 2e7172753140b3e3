#!/bin/sh
# The official redis image's entrypoint: "-flags" or a .conf file start
# redis-server; files in /data become the redis user's.
set -e

if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

if [ "$1" = redis-server ] || [ "$1" = redis-sentinel ]; then
	# The official build turns protected mode off by default: it only
	# matters without a config file, and a container is reached from outside.
	case "${2:-}" in
	"" | -*)
		cmd=$1
		shift
		set -- "$cmd" --protected-mode no "$@"
		;;
	esac
	if [ "$(id -u)" = 0 ]; then
		find . \! -user redis -exec chown redis '{}' +
		exec setpriv --reuid=redis --regid=redis --init-groups "$@"
	fi
fi
exec "$@"
