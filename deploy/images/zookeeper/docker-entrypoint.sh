#!/bin/bash
# The official zookeeper image's entrypoint.
set -e

if [[ "$1" = 'zkServer.sh' && "$(id -u)" = '0' ]]; then
	chown -R zookeeper "$ZOO_DATA_DIR" "$ZOO_DATA_LOG_DIR"
	exec setpriv --reuid=zookeeper --regid=zookeeper --init-groups "$0" "$@"
fi

if [[ ! -f "$ZOO_CONF_DIR/zoo.cfg" ]]; then
	CONFIG="$ZOO_CONF_DIR/zoo.cfg"
	{
		echo "dataDir=$ZOO_DATA_DIR"
		echo "dataLogDir=$ZOO_DATA_LOG_DIR"
		echo "tickTime=$ZOO_TICK_TIME"
		echo "initLimit=$ZOO_INIT_LIMIT"
		echo "syncLimit=$ZOO_SYNC_LIMIT"
		echo "autopurge.snapRetainCount=$ZOO_AUTOPURGE_SNAPRETAINCOUNT"
		echo "autopurge.purgeInterval=$ZOO_AUTOPURGE_PURGEINTERVAL"
		echo "maxClientCnxns=$ZOO_MAX_CLIENT_CNXNS"
		echo "standaloneEnabled=$ZOO_STANDALONE_ENABLED"
		echo "admin.enableServer=$ZOO_ADMINSERVER_ENABLED"
		for server in ${ZOO_SERVERS:-server.1=localhost:2888:3888;2181}; do
			echo "$server"
		done
		if [[ -n $ZOO_4LW_COMMANDS_WHITELIST ]]; then
			echo "4lw.commands.whitelist=$ZOO_4LW_COMMANDS_WHITELIST"
		fi
		for extra in $ZOO_CFG_EXTRA; do
			echo "$extra"
		done
	} >"$CONFIG"
fi

if [[ ! -f "$ZOO_DATA_DIR/myid" ]]; then
	echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi

exec "$@"
