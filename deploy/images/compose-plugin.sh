#!/bin/sh
# Builds Docker Compose v2 from its Go module, pinned, and installs it as the
# docker CLI plugin ~/.docker/cli-plugins/docker-compose (Debian 12 packages
# only compose v1). Needs Go and the Go module proxy; a few minutes.
set -eu
VERSION=v2.29.7
dest=${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins/docker-compose
if [ -x "$dest" ] && "$dest" version 2>/dev/null | grep -q "$VERSION"; then
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
go mod init compose-plugin >/dev/null 2>&1
echo "compose-plugin: building docker compose $VERSION"
GOFLAGS=-mod=mod go get "github.com/docker/compose/v2@$VERSION"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$VERSION" \
	-o docker-compose github.com/docker/compose/v2/cmd
mkdir -p "$(dirname "$dest")"
mv docker-compose "$dest"
