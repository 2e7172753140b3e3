package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestBadFlagsExit2NamingTheFlag(t *testing.T) {
	tests := []struct {
		args []string
		flag string // the flag the one line must name
	}{
		{[]string{"--backends", "paxos"}, "backends"},
		{[]string{"--backends", "redis,,etcd"}, "backends"},
		{[]string{"--guards", "hope"}, "guards"},
		{[]string{"--replicas", "0"}, "replicas"},
		{[]string{"--replicas", "three"}, "replicas"},
		{[]string{"--stock", "-1"}, "stock"},
		{[]string{"--requests", "0"}, "requests"},
		{[]string{"--rate", "0"}, "rate"},
		{[]string{"--workers", "0"}, "workers"},
		{[]string{"--skus", "0"}, "skus"},
		{[]string{"--work-delay", "soon"}, "work-delay"},
		{[]string{"--work-delay", "-1ms"}, "work-delay"},
		{[]string{"--lock-ttl", "0s"}, "lock-ttl"},
		{[]string{"--topology", "mesh"}, "topology"},
		{[]string{"--accept", "async"}, "accept"},
		{[]string{"--accept", "queue", "--gates", "none"}, "accept"},
		{[]string{"--topology", "cluster", "--target", "http://127.0.0.1:8080", "--backends", "redis", "--guards", "none"}, "topology"},
		{[]string{"--servers", "postgres=127.0.0.1:5432"}, "servers"},
		{[]string{"--servers", "redis="}, "servers"},
		{[]string{"--target", "127.0.0.1:8080"}, "target"},
		{[]string{"--target", "http://127.0.0.1:8080"}, "target"}, // the default matrix is many runs
		{[]string{"--out", ""}, "out"},
		{[]string{"--seed", "x"}, "seed"},
		{[]string{"--bogus"}, "bogus"},
		{[]string{"extra"}, "extra"},
		{[]string{"--merge", "a,,b"}, "merge"},
		{[]string{"--merge", "a", "--fault", "pause-holder"}, "merge"},
		{[]string{"--workload", "reservations", "--fault", "pause-holder"}, "fault"},
		{[]string{"--fault", "reservation-expiry-race"}, "fault"},
		{[]string{"--merge", "a", "--backends", "redis"}, "merge"},
		{[]string{"--merge", "a,lab-report"}, "out"},
		{[]string{"--merge", "a", "--out", ""}, "out"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tc.args, &stdout, &stderr)
			if code != exitBadFlags {
				t.Errorf("exit %d, want %d", code, exitBadFlags)
			}
			msg := stderr.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
				t.Errorf("stderr is not one line: %q", msg)
			}
			if !strings.Contains(msg, tc.flag) {
				t.Errorf("stderr %q does not name %q", msg, tc.flag)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout not empty: %q", stdout.String())
			}
		})
	}
}

func TestHelpExits0(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-h"}, &stdout, &stderr); code != exitRan {
		t.Errorf("exit %d", code)
	}
	if !strings.Contains(stderr.String(), "--servers") && !strings.Contains(stderr.String(), "-servers") {
		t.Errorf("help does not describe --servers:\n%s", stderr.String())
	}
}

func TestSpecs(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "[local/none redis/none redlock/none zookeeper/none mysql/none etcd/none none/version none/atomic none/atomic+gate none/none+gate none/atomic+gate+queue " +
			"local/none+reservations redis/none+reservations redlock/none+reservations zookeeper/none+reservations mysql/none+reservations etcd/none+reservations]"},
		{[]string{"--backends", "none", "--guards", "version,atomic"}, "[none/version none/atomic]"},
		{[]string{"--backends", "redis,etcd"}, "[redis/none etcd/none]"},
		{[]string{"--backends", "redis, redis ,local", "--guards", "none,fencing"}, "[redis/none redis/fencing local/none local/fencing]"},
		{[]string{"--gates", "none,redis"}, "[none/atomic none/atomic+gate none/none none/none+gate]"},
		{[]string{"--backends", "redis,none", "--guards", "atomic", "--gates", "redis"}, "[redis/atomic+gate none/atomic+gate]"},
		{[]string{"--accept", "sync,queue"}, "[none/atomic none/atomic+gate+queue none/none none/none+gate+queue]"},
		{[]string{"--backends", "redis", "--guards", "version", "--gates", "none,redis", "--accept", "queue,sync"}, "[redis/version redis/version+gate+queue redis/version+gate]"},
		{[]string{"--guards", "fencing"}, "[local/fencing redis/fencing redlock/fencing zookeeper/fencing mysql/fencing etcd/fencing]"},
	}
	for _, tc := range tests {
		cfg, err := parseFlags(tc.args, nil)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		var names []string
		for _, s := range cfg.specs() {
			names = append(names, s.Name())
			if s.Workload != "" {
				if s.Replicas != 3 || s.Stock != 100 || s.Requests != defaultCheckouts || s.SKUs != defaultCheckoutSKUs || s.Guard != "none" {
					t.Errorf("%q: reservations spec %+v lacks the defaults", tc.args, s)
				}
				continue
			}
			if s.Replicas != 3 || s.Stock != 100 || s.Requests != 600 || s.SKUs != 1 {
				t.Errorf("%q: spec %+v lacks the defaults", tc.args, s)
			}
		}
		if got := fmt.Sprint(names); got != tc.want {
			t.Errorf("%q: runs %s, want %s", tc.args, got, tc.want)
		}
	}
}

func TestServersFlag(t *testing.T) {
	cfg, err := parseFlags([]string{
		"--servers", "mysql=root@tcp(10.1.1.1:3306)/oversold?parseTime=true&sql_mode='A,B',redis=sentinel://m@h1:26379,h2:26379",
		"--servers", "redlock=h1:1;h2:2;h3:3,zookeeper=z1:2181,z2:2181,etcd=http://e:2379",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := servers{
		"mysql":   "root@tcp(10.1.1.1:3306)/oversold?parseTime=true&sql_mode='A,B'",
		"redis":   "sentinel://m@h1:26379,h2:26379",
		"redlock": "h1:1;h2:2;h3:3",
		"zk":      "z1:2181,z2:2181",
		"etcd":    "http://e:2379",
	}
	if fmt.Sprint(cfg.servers) != fmt.Sprint(want) {
		t.Errorf("servers %v\nwant    %v", cfg.servers, want)
	}
	if got := addrList(cfg.servers["redlock"]); fmt.Sprint(got) != "[h1:1 h2:2 h3:3]" {
		t.Errorf("redlock list %q", got)
	}
	if got := addrList(cfg.servers["zk"]); fmt.Sprint(got) != "[z1:2181 z2:2181]" {
		t.Errorf("zk list %q", got)
	}
}

func TestTargetRunsOneConfiguration(t *testing.T) {
	cfg, err := parseFlags([]string{"--target", "http://127.0.0.1:8080/", "--backends", "redis", "--guards", "version"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.target != "http://127.0.0.1:8080" || len(cfg.specs()) != 1 {
		t.Errorf("target %q, %d runs", cfg.target, len(cfg.specs()))
	}
}
