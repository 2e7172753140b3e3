#!/bin/sh
# Prints the DOCKER_HOST of a Docker engine that answers: the caller's
# (DOCKER_HOST or the default socket), else a private dockerd this script
# starts as root on unix:///run/oversold-docker.sock (data in
# /var/lib/oversold-docker, log in /var/log/oversold-dockerd.log), left
# running for the next call; `engine.sh stop` stops that one. Exits 1, with
# the reason on stderr, when there is none and it cannot start one.
set -u
sock=/run/oversold-docker.sock
pidfile=/run/oversold-docker.pid
log=/var/log/oversold-dockerd.log

if [ "${1:-}" = stop ]; then
	[ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
	exit 0
fi

answers() { DOCKER_HOST=$1 docker info >/dev/null 2>&1; }

command -v docker >/dev/null || { echo "engine: no docker client (apt-get install -y docker.io)" >&2; exit 1; }
if answers "${DOCKER_HOST:-unix:///var/run/docker.sock}"; then
	echo "${DOCKER_HOST:-unix:///var/run/docker.sock}"
	exit 0
fi
if answers "unix://$sock"; then
	echo "unix://$sock"
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v dockerd >/dev/null; then
	echo "engine: no Docker engine answers, and starting one needs root and dockerd (apt-get install -y docker.io)" >&2
	exit 1
fi

# The default bridge first (the compose demo needs it); where iptables or
# the bridge cannot be set up, an engine without them still runs the
# testbed, whose containers use the host's network.
for flags in "" "--iptables=false --bridge=none"; do
	# shellcheck disable=SC2086 # flags is a word list
	nohup dockerd --host "unix://$sock" --data-root /var/lib/oversold-docker \
		--exec-root /run/oversold-docker --pidfile "$pidfile" $flags >>"$log" 2>&1 &
	pid=$!
	for _ in $(seq 60); do
		if answers "unix://$sock"; then
			echo "engine: started dockerd $flags (pid $pid, log $log)" >&2
			echo "unix://$sock"
			exit 0
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
done
echo "engine: dockerd did not start; see $log" >&2
exit 1
