//go:build tools

// Package tools pins the modules the project's packages are being built on,
// so that parallel work does not fight over go.mod. Removed once all are used.
package tools

import (
	_ "github.com/Shopify/toxiproxy/v2"
	_ "github.com/bsm/redislock"
	_ "github.com/compose-spec/compose-go/v2/cli"
	_ "github.com/compose-spec/compose-go/v2/loader"
	_ "github.com/go-redsync/redsync/v4"
	_ "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	_ "github.com/go-zookeeper/zk"
	_ "github.com/google/uuid"
	_ "github.com/labstack/echo/v4"
	_ "github.com/labstack/echo/v4/middleware"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/tsenart/vegeta/v12/lib"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.uber.org/goleak"
	_ "gorm.io/driver/mysql"
	_ "gorm.io/gorm"
	_ "k8s.io/api/apps/v1"
	_ "k8s.io/api/autoscaling/v2"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/api/policy/v1"
	_ "sigs.k8s.io/yaml"
)
