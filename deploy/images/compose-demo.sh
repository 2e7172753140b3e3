#!/bin/sh
# make compose-demo: docker-compose.yml brought up on a Docker engine, every
# healthcheck waited for, the lab service run against the balancer and its
# invariants checked, then `docker compose down -v` whatever happened.
# Where no registry answers, the stand-ins of deploy/images (Debian packages)
# replace the registry's images through compose/docker-compose.standin.yml;
# Grafana, which Debian does not package, is then left out.
set -eu
cd "$(dirname "$0")/../.."
images=deploy/images
DOCKER_HOST=$("$images/engine.sh")
export DOCKER_HOST
docker compose version >/dev/null 2>&1 || "$images/compose-plugin.sh"
echo "compose-demo: $(docker compose version)"

files="-f docker-compose.yml"
if [ "${OVERSOLD_STANDIN:-}" = 1 ] || ! timeout 120 docker pull -q redis:7.4-alpine >/dev/null 2>&1; then
	echo "compose-demo: no registry (or OVERSOLD_STANDIN=1): stand-in images, without Grafana"
	"$images/build.sh"
	for image in nginx prometheus runtime; do
		echo "images: oversold-local/$image:latest"
		docker build -q -t "oversold-local/$image:latest" "$images/compose/$image" >/dev/null
	done
	echo "images: oversold-local/golang:latest (this machine's Go)"
	# The context is a tar of the Go tree, this machine's CA bundle (the
	# module proxy is reached as from here) and the Dockerfile.
	goroot=$(go env GOROOT)
	tar -c --transform "s,^$(basename "$goroot"),go," -C "$(dirname "$goroot")" "$(basename "$goroot")" \
		-C /etc/ssl/certs ca-certificates.crt -C "$PWD/$images/compose/golang" Dockerfile |
		docker build -q -t oversold-local/golang:latest - >/dev/null
	files="$files -f $images/compose/docker-compose.standin.yml"
fi
compose() {
	# shellcheck disable=SC2086 # files is a word list
	docker compose $files "$@"
}
trap 'compose --profile lab down -v --remove-orphans' EXIT

compose build
compose up -d --wait --wait-timeout 300
compose ps
compose run --rm lab
echo "compose-demo: the lab's runs, checked"
compose run --rm --no-deps --entrypoint cat lab /lab-report/results.json |
	go run ./deploy/images/compose/checkresults
