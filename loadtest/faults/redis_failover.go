package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// masterName is the Sentinel name of the scenario's master.
const masterName = "mymaster"

// failoverTTL is the shortest lock TTL the scenario runs with. The
// sentinels here declare a master down after 1s and promote a replica
// within about 1-3s more; a shorter lease would run out before the second
// holder could exist.
const failoverTTL = 5 * time.Second

// RedisFailover loses a lock in a Sentinel failover (Jepsen's Redis
// Sentinel analysis: a failover loses acknowledged writes that were not
// replicated). The run gets a private master, one replica and three
// sentinels (quorum 2), and the replicas reach Redis through the sentinels
// (sentinel://mymaster@...), the stock cache included. The replication link
// runs through a proxy; the fault cuts it (data from the master is dropped,
// as in a partition), lets a replica take the lock on the master, kills the
// master (SIGKILL), waits for the sentinels to promote the replica, which
// never saw the lock, and lets a second replica take the same lock there
// while the first still holds it: two holders.
//
// The fencing token is an INCR on the same Redis, so the promoted replica's
// counter is behind by every grant it missed: it hands out tokens again
// that the old master already gave. MySQL keeps the highest fence it saw
// and refuses "fence < token" when equal or lower, so under guard fencing
// one of the two holders is refused; the token itself is not safe across a
// failover.
func RedisFailover() loadtest.Fault {
	var runs perRun[*failover]
	return loadtest.Fault{
		Backends: []string{"redis"},
		Prepare: func(ctx context.Context, run *loadtest.Run) (func(), error) {
			f, err := startFailover(ctx)
			if err != nil {
				return nil, err
			}
			hook, err := startInsideHook()
			if err != nil {
				f.Close()
				return nil, err
			}
			f.hook = hook
			run.Servers.RedisAddr = f.Addr()
			hookEveryReplica(run, hook)
			if d := ttl(run); d < failoverTTL {
				for _, env := range run.ReplicaEnv {
					env["OVERSOLD_LOCK_TTL"] = failoverTTL.String()
				}
				run.Eventf("lock TTL raised from %s to %s for this scenario: a failover takes seconds, and a lease that ends before the promotion cannot overlap a new one", d, failoverTTL)
			}
			runs.put(run, f)
			return func() {
				runs.drop(run)
				hook.Close()
				f.Close()
			}, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run) error {
			f, err := runs.get(run)
			if err != nil {
				return err
			}
			return f.inject(ctx, run)
		},
	}
}

// failover is the private Sentinel deployment of one run.
type failover struct {
	master, replica *testbed.Server
	link            *proxy // the replica's replication link to the master
	sentinels       []*testbed.Server
	hook            *insideHook
}

func startFailover(ctx context.Context) (f *failover, err error) {
	f = &failover{}
	defer func() {
		if err != nil {
			f.Close()
			f = nil
		}
	}()
	if f.master, err = testbed.StartRedis(ctx, testbed.Options{}); err != nil {
		return
	}
	if f.link, err = startProxy("replication", f.master.Addr); err != nil {
		return
	}
	host, port, _ := net.SplitHostPort(f.link.Addr())
	if f.replica, err = testbed.StartRedis(ctx, testbed.Options{Args: []string{"--replicaof", host, port}}); err != nil {
		return
	}
	if err = waitFor(ctx, 15*time.Second, "replica in sync", func(ctx context.Context) error {
		return infoHas(ctx, f.replica.Addr, "replication", "master_link_status:up")
	}); err != nil {
		return
	}
	f.sentinels = make([]*testbed.Server, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range f.sentinels {
		wg.Go(func() {
			f.sentinels[i], errs[i] = testbed.StartSentinel(ctx, masterName, f.master.Addr, 2, testbed.Options{})
		})
	}
	wg.Wait()
	if err = errors.Join(errs...); err != nil {
		return
	}
	// A failover needs every sentinel to know the replica and the other
	// sentinels (they meet through the master's hello channel, every 2s).
	for _, s := range f.sentinels {
		if err = waitFor(ctx, 20*time.Second, "sentinel "+s.Addr+" ready", func(ctx context.Context) error {
			return sentinelReady(ctx, s.Addr, len(f.sentinels)-1)
		}); err != nil {
			return
		}
	}
	return f, nil
}

// Addr is the replicas' OVERSOLD_REDIS_ADDR.
func (f *failover) Addr() string {
	addrs := make([]string, len(f.sentinels))
	for i, s := range f.sentinels {
		addrs[i] = s.Addr
	}
	return "sentinel://" + masterName + "@" + strings.Join(addrs, ",")
}

func (f *failover) Close() {
	for _, s := range append(f.sentinels, f.replica, f.master) {
		if s != nil {
			s.Stop()
		}
	}
	if f.link != nil {
		f.link.Close()
	}
}

func (f *failover) inject(ctx context.Context, run *loadtest.Run) error {
	c, err := nth(ctx, f.hook, warmup(run), at(atBeforeWrite, ""))
	if err != nil {
		return nil
	}
	c.Answer()
	// Cut replication: what the master writes from now on never reaches
	// the replica.
	if err := f.link.toxic("cut", "timeout", "downstream", map[string]int64{"timeout": 0}); err != nil {
		return err
	}
	run.Eventf("replication from the master to the replica cut")
	// The next holder whose lock the replica does not have.
	var first *hookCall
	seen := 0
	var lastErr error
	for range 20 {
		c, err := f.hook.next(ctx, at(atBeforeWrite, ""))
		if err != nil {
			run.Eventf("the load ended before a lock the replica missed (%d holders seen after the cut, each already replicated; last check error: %v)", seen, lastErr)
			return nil
		}
		seen++
		has, err := hasKey(ctx, f.replica.Addr, "lock:{sku/"+c.SKU+"}")
		if err == nil && !has {
			first = c
			break
		}
		lastErr = err
		c.Answer()
	}
	if first == nil {
		return fmt.Errorf("the replica had every one of %d locks granted after the replication cut", seen)
	}
	defer first.Answer()
	t0 := time.Now()
	if err := f.master.Kill(); err != nil {
		return err
	}
	run.Disrupted("", t0)
	run.Eventf("%s holds the lock on the master, which the replica never saw; master killed (SIGKILL)", first)
	if err := waitFor(ctx, 30*time.Second, "promotion", func(ctx context.Context) error {
		return promoted(ctx, f.sentinels[0].Addr, f.replica.Addr)
	}); err != nil {
		return err
	}
	run.Eventf("sentinels promoted the replica %s after the kill", since(t0))
	if err := raceSecondHolder(ctx, run, f.hook, first, max(ttl(run), failoverTTL)); err != nil {
		return err
	}
	run.Eventf("%s's token was %d; tokens now come from the promoted replica's counter, which missed every grant since the cut", first.Replica, first.Token)
	return nil
}

// waitFor polls check every 100ms until it returns nil, for at most limit.
func waitFor(ctx context.Context, limit time.Duration, what string, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		err := check(cctx)
		ccancel()
		if err == nil {
			return nil
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return fmt.Errorf("%s: not within %s: %w", what, limit, err)
		}
	}
}

// client is a one-connection client for a fault's own checks.
func client(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1, PoolSize: 1})
}

func infoHas(ctx context.Context, addr, section, want string) error {
	c := client(addr)
	defer c.Close()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return err
	}
	if !strings.Contains(info, want) {
		return fmt.Errorf("%s: INFO %s has no %q", addr, section, want)
	}
	return nil
}

func hasKey(ctx context.Context, addr, key string) (bool, error) {
	c := client(addr)
	defer c.Close()
	n, err := c.Exists(ctx, key).Result()
	return n == 1, err
}

// sentinelReady: the sentinel knows the replica and the other sentinels.
func sentinelReady(ctx context.Context, addr string, others int) error {
	c := client(addr)
	defer c.Close()
	m, err := c.Do(ctx, "SENTINEL", "MASTER", masterName).Result()
	if err != nil {
		return err
	}
	fields := map[string]string{}
	switch v := m.(type) {
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			fields[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
		}
	case map[any]any:
		for k, val := range v {
			fields[fmt.Sprint(k)] = fmt.Sprint(val)
		}
	}
	if fields["num-slaves"] != "1" || fields["num-other-sentinels"] != fmt.Sprint(others) {
		return fmt.Errorf("sentinel %s: %s replicas, %s other sentinels", addr, fields["num-slaves"], fields["num-other-sentinels"])
	}
	return nil
}

// promoted: the sentinel names want as the master, and want says it is one.
func promoted(ctx context.Context, sentinel, want string) error {
	c := client(sentinel)
	defer c.Close()
	addr, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName).StringSlice()
	if err != nil {
		return err
	}
	if len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != want {
		return fmt.Errorf("master is %v", addr)
	}
	return infoHas(ctx, want, "replication", "role:master")
}
