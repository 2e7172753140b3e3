#!/bin/bash
# The official mysql image's entrypoint, for MariaDB: on an empty data
# directory it installs the system tables, sets the root password
# (MYSQL_ROOT_PASSWORD, MYSQL_ALLOW_EMPTY_PASSWORD or MYSQL_RANDOM_ROOT_PASSWORD;
# root@MYSQL_ROOT_HOST, default '%'), creates MYSQL_DATABASE and
# MYSQL_USER/MYSQL_PASSWORD (all privileges on that database) and runs
# /docker-entrypoint-initdb.d/*.sql and *.sh, on a temporary server without
# networking, so nothing can connect before it is done.
set -eo pipefail

if [ "${1:0:1}" = '-' ]; then
	set -- mysqld "$@"
fi
if [ "$1" != mysqld ] && [ "$1" != mariadbd ]; then
	exec "$@"
fi

datadir=/var/lib/mysql
for a in "$@"; do
	case "$a" in --datadir=*) datadir=${a#--datadir=} ;; esac
done

if [ ! -d "$datadir/mysql" ]; then
	if [ -z "${MYSQL_ROOT_PASSWORD:-}" ] && [ -z "${MYSQL_ALLOW_EMPTY_PASSWORD:-}" ] && [ -z "${MYSQL_RANDOM_ROOT_PASSWORD:-}" ]; then
		echo >&2 'error: database is uninitialized and password option is not specified'
		echo >&2 '  You need to specify one of MYSQL_ROOT_PASSWORD, MYSQL_ALLOW_EMPTY_PASSWORD and MYSQL_RANDOM_ROOT_PASSWORD'
		exit 1
	fi
	mkdir -p "$datadir"
	chown mysql:mysql "$datadir"
	echo 'entrypoint: initializing database'
	mariadb-install-db --user=mysql --datadir="$datadir" --auth-root-authentication-method=normal \
		--skip-test-db --skip-name-resolve >/dev/null
	sock=/run/mysqld/init.sock
	"$@" --user=mysql --datadir="$datadir" --skip-networking --socket="$sock" &
	pid=$!
	for _ in $(seq 60); do
		mariadb-admin --socket="$sock" -uroot ping >/dev/null 2>&1 && break
		sleep 1
	done
	sql() { mariadb --protocol=socket --socket="$sock" -uroot "$@"; }
	if [ -n "${MYSQL_RANDOM_ROOT_PASSWORD:-}" ]; then
		MYSQL_ROOT_PASSWORD=$(head -c 18 /dev/urandom | base64)
		echo "GENERATED ROOT PASSWORD: $MYSQL_ROOT_PASSWORD"
	fi
	host=${MYSQL_ROOT_HOST:-%}
	pw=${MYSQL_ROOT_PASSWORD:-}
	{
		# Like the official image: root only at localhost and MYSQL_ROOT_HOST
		# (install-db also made root@127.0.0.1, which would shadow '%').
		echo "DELETE FROM mysql.global_priv WHERE User='' OR (User='root' AND Host<>'localhost');"
		echo "FLUSH PRIVILEGES;"
		echo "ALTER USER 'root'@'localhost' IDENTIFIED BY '${pw//\'/\'\'}';"
		if [ "$host" != localhost ]; then
			echo "CREATE USER 'root'@'$host' IDENTIFIED BY '${pw//\'/\'\'}';"
			echo "GRANT ALL ON *.* TO 'root'@'$host' WITH GRANT OPTION;"
		fi
		if [ -n "${MYSQL_DATABASE:-}" ]; then
			echo "CREATE DATABASE IF NOT EXISTS \`$MYSQL_DATABASE\`;"
		fi
		if [ -n "${MYSQL_USER:-}" ] && [ -n "${MYSQL_PASSWORD:-}" ]; then
			echo "CREATE USER '$MYSQL_USER'@'%' IDENTIFIED BY '${MYSQL_PASSWORD//\'/\'\'}';"
			if [ -n "${MYSQL_DATABASE:-}" ]; then
				echo "GRANT ALL ON \`$MYSQL_DATABASE\`.* TO '$MYSQL_USER'@'%';"
			fi
		fi
		echo "FLUSH PRIVILEGES;"
	} | sql
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh) echo "entrypoint: running $f"; . "$f" ;;
		*.sql) echo "entrypoint: running $f"; MYSQL_PWD=$pw sql ${MYSQL_DATABASE:+"$MYSQL_DATABASE"} <"$f" ;;
		esac
	done
	kill "$pid"
	wait "$pid" || true
	echo 'entrypoint: MySQL init process done. Ready for start up.'
fi

exec "$@" --user=mysql --datadir="$datadir"
