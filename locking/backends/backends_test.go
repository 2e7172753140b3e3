package backends_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/backends"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// startRedis starts a private Redis with args, stopped when the test ends.
func startRedis(t *testing.T, args ...string) string {
	t.Helper()
	if cmd := testbed.Missing(testbed.KindRedis); cmd != "" {
		t.Skip(cmd)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := testbed.StartRedis(ctx, testbed.Options{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s.Addr
}

// A Redis that may evict keys can drop a held lock or its fence counter:
// Open refuses it, naming the setting and the fix, for redis and for any
// Redlock node.
func TestOpenRefusesEvictingRedis(t *testing.T) {
	evicting := startRedis(t, "--maxmemory-policy", "allkeys-lru")
	safe := startRedis(t)
	cases := []struct {
		name string
		cfg  backends.Config
	}{
		{"redis", backends.Config{RedisAddr: evicting}},
		{"redlock", backends.Config{RedlockAddrs: []string{safe, safe, evicting}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := backends.Open(t.Context(), c.name, c.cfg)
			if err == nil {
				l.Close()
				t.Fatal("opened a lock on a Redis with maxmemory-policy allkeys-lru")
			}
			for _, want := range []string{"maxmemory-policy allkeys-lru", "noeviction"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
	// The default policy (noeviction) opens.
	l, err := backends.Open(t.Context(), "redis", backends.Config{RedisAddr: safe})
	if err != nil {
		t.Fatalf("open on a noeviction Redis: %v", err)
	}
	l.Close()
}
