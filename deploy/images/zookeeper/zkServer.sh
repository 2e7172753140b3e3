#!/bin/bash
# zkServer.sh of the official image, the two commands containers use:
#   start-foreground  runs the server on $ZOO_CONF_DIR/zoo.cfg
#   status            asks the server ("srvr") and prints its Mode; exit 1
#                     when it does not serve
set -e
cfg=${ZOOCFGDIR:-${ZOO_CONF_DIR:-/conf}}/zoo.cfg
case "$1" in
start-foreground)
	cp=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar
	# shellcheck disable=SC2086 # the flags are word lists
	exec java -Dzookeeper.log.dir=/tmp -Dlog4j.configuration=file:/etc/zookeeper-docker/log4j.properties \
		-XX:+UseSerialGC -XX:-UsePerfData $SERVER_JVMFLAGS $JVMFLAGS \
		-cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$cfg"
	;;
status)
	port=$(sed -n 's/^clientPort=//p' "$cfg" | tail -1)
	host=$(sed -n 's/^clientPortAddress=//p' "$cfg" | tail -1)
	if [[ -z $port ]]; then # "server.N=host:2888:3888;2181" carries it
		port=$(grep -o ';[^;]*$' "$cfg" | head -1 | sed 's/^;//; s/.*://')
	fi
	mode=$(echo srvr | nc -q 2 -w 2 "${host:-127.0.0.1}" "${port:-2181}" 2>/dev/null | sed -n 's/^Mode: //p')
	if [[ -z $mode ]]; then
		echo "Error contacting service. It is probably not running." >&2
		exit 1
	fi
	echo "Client port found: ${port:-2181}. Client address: ${host:-localhost}."
	echo "Mode: $mode"
	;;
*)
	echo "usage: zkServer.sh start-foreground|status" >&2
	exit 1
	;;
esac
