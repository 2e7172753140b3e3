package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/internal/clock"
	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/loadtest"
)

// masterName is the Sentinel name of the scenario's master.
const masterName = "mymaster"

// failoverTTL is the shortest lock TTL the scenario runs with: Redisson's
// default lease (30 s, renewed every 10 s; REFERENCES.md). A holder learns
// that its lease is gone only from a renewal, so the first renewal must be
// due after the second holder's grant: the sentinels here take about 2 s
// from the kill to +switch-master (1 s down-after, then the vote), and a
// split vote costs another 6 s (twice the 3 s failover-timeout) before the
// next try. With a shorter lease the first holder's renewal can reach the
// promoted replica first, find its key gone and end the lease before the
// second holder exists: an overlap of luck, not of the failover.
const failoverTTL = 30 * time.Second

// The replication link's own ACL user: cutting it (user off, its
// connections killed) stops replication without touching anything Sentinel
// manages, so no sentinel can undo the cut.
const (
	replUser = "repl"
	replPass = "oversold-repl"
)

// Orders the fault drives through the master before the second holder:
// warmOrders while replication runs (the replica has their counter), then
// cutOrders after the cut (the master's counter and MySQL's fence move on,
// the replica's does not).
const (
	warmOrders = 2
	cutOrders  = 2
	// afterOrders bounds the orders sent after the failover until one is
	// placed: under guard fencing, each token at or below MySQL's fence is
	// refused.
	afterOrders = 8
)

// RedisFailover loses a lock in a Sentinel failover (Jepsen's Redis
// Sentinel analysis: a failover loses acknowledged writes that were not
// replicated). The run gets a private master, one replica and three
// sentinels (quorum 2), and the replicas reach Redis through the sentinels
// (sentinel://mymaster@...), the stock cache included. The replica
// replicates as an ACL user of its own; the sentinels and orderd use the
// default user.
//
// The fault drives its own orders on the run's fault SKU: two go through
// the master and reach the replica; then replication is cut (ACL SETUSER
// repl off, CLIENT KILL USER repl: the replica's link drops and cannot log
// in again, the master keeps serving, the sentinels still see both); two
// more orders go through the master only; a replica of orderd takes the lock
// on the master, whose key and fence INCR the replica never gets, and waits
// at the fault hook before its write. The master is killed (SIGKILL), the
// sentinels promote the replica within seconds (the cut is far shorter than
// the ten down-after periods that would make the replica ineligible), and a
// second orderd replica takes the same lock on the promoted one while the
// first still holds it: two holders. The second writes first, then the
// first. The old master stays dead: it never comes back as a master.
//
// The fencing token is an INCR on the same Redis, so the promoted replica's
// counter is behind by every grant it missed: it hands out again tokens the
// old master already gave, at or below the fence MySQL keeps. Under guard
// fencing the second holder is refused, and so is every order after it
// until the counter passes the fence: safe, but not available. Under guard
// version the stale write is refused (the promoted replica's stock cache is
// behind too: it missed the cut orders' cache updates). Under guard none
// the second holder writes the stale stock: a lost update.
//
// Under lock none the failover strikes the stock gate's Redis (--gates
// redis), or the cache's alone without it: injectSoldOut.
func RedisFailover() loadtest.Fault {
	return failoverFault(startFailover, []string{"redis", "none"})
}

// failoverFault is a failover scenario on the deployment start makes for
// each run (Sentinel, a Redis Cluster).
func failoverFault(start func(context.Context) (*failover, error), backends []string) loadtest.Fault {
	return scenario[*failover]{
		Backends: backends,
		Prepare: func(ctx context.Context, run *loadtest.Run) (*failover, func(), error) {
			f, err := start(ctx)
			if err != nil {
				return nil, nil, err
			}
			run.Servers.RedisAddr = f.Addr()
			f.ttl = ttl(run)
			if f.ttl < failoverTTL && run.Spec.Backend != "none" {
				for _, env := range run.ReplicaEnv {
					env["OVERSOLD_LOCK_TTL"] = failoverTTL.String()
				}
				run.Eventf("lock TTL raised from %s to %s (Redisson's default) for this scenario: a holder learns of the failover at its first renewal, due at TTL/3, which must come after the promotion", f.ttl, failoverTTL)
				f.ttl = failoverTTL
			}
			return f, f.Close, nil
		},
		Inject: func(ctx context.Context, run *loadtest.Run, d *driver, f *failover, r1, r2 *loadtest.Replica) error {
			if run.Spec.Backend == "none" {
				return f.injectSoldOut(ctx, run, d, r1, r2)
			}
			return f.inject(ctx, run, d, r1, r2)
		},
	}.fault()
}

// failover is the private Sentinel deployment of one run, or its Redis
// Cluster.
type failover struct {
	master, replica *testbed.Server // for a cluster: of the fault SKU's slot, picked by inject
	sentinels       []*testbed.Server
	cluster         *testbed.Cluster
	ttl             time.Duration // the replicas' lock TTL
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
	// Replication gets a user of its own; everyone else keeps the default.
	// The first sync starts at once (Redis 7 waits 5 s for more replicas).
	mc := client(f.master.Addr)
	err = mc.Do(ctx, "ACL", "SETUSER", replUser, "on", ">"+replPass, "~*", "&*", "+@all").Err()
	if err == nil {
		err = mc.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err()
	}
	mc.Close()
	if err != nil {
		err = fmt.Errorf("replication user on the master: %w", err)
		return
	}
	host, port, _ := net.SplitHostPort(f.master.Addr)
	if f.replica, err = testbed.StartRedis(ctx, testbed.Options{Args: []string{
		"--replicaof", host, port, "--masteruser", replUser, "--masterauth", replPass,
	}}); err != nil {
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
	if f.cluster != nil {
		return strings.Join(f.cluster.Addrs(), ",")
	}
	addrs := make([]string, len(f.sentinels))
	for i, s := range f.sentinels {
		addrs[i] = s.Addr
	}
	return "sentinel://" + masterName + "@" + strings.Join(addrs, ",")
}

func (f *failover) Close() {
	if f.cluster != nil {
		f.cluster.Stop()
		return
	}
	for _, s := range append(f.sentinels, f.replica, f.master) {
		if s != nil {
			s.Stop()
		}
	}
}

func (f *failover) inject(ctx context.Context, run *loadtest.Run, d *driver, r1, r2 *loadtest.Replica) error {
	lockKey := "lock:{sku/" + run.FaultSKU + "}"
	fenceKey := lockKey + ":fence"
	if f.cluster != nil {
		if err := f.pickSlot(ctx, run, lockKey); err != nil {
			return err
		}
	}
	mc, rc := client(f.master.Addr), f.replicaClient(ctx)
	defer mc.Close()
	defer rc.Close()

	if ok, err := warm(ctx, run, d, r2, mc); !ok {
		return err
	}
	masterFence, replicaFence := counter(ctx, mc, fenceKey), counter(ctx, rc, fenceKey)
	if masterFence != replicaFence {
		notFired(run, fmt.Errorf("the replica did not catch up before the cut: fence counter %d on the master, %d on the replica", masterFence, replicaFence))
		return nil
	}

	tCut, err := f.cut(ctx, mc)
	if err != nil {
		return err
	}
	run.Eventf("%d orders placed on %s through %s and replicated; then replication cut (ACL SETUSER %s off, CLIENT KILL USER %s on the master): the replica's link is down, both have the fence counter at %d", warmOrders, run.FaultSKU, r2.Name, replUser, replUser, replicaFence)

	// Orders through the master only.
	for i := range cutOrders {
		if p := quietly(ctx, run, d, r2, fmt.Sprintf("cut-%d", i+1)); !ordered(p) {
			notFired(run, fmt.Errorf("an order after the cut was not placed (status %d %s)", p.status, p.code))
			return nil
		}
	}
	masterFence, replicaFence = counter(ctx, mc, fenceKey), counter(ctx, rc, fenceKey)
	fenceBefore, _ := mysqlFence(ctx, run.Servers.MySQLDSN, run.FaultSKU)
	run.Eventf("%d more orders placed through the master after the cut: its fence counter is at %d, the replica's still at %d (MySQL's fence: %d)", cutOrders, masterFence, replicaFence, fenceBefore)

	// The first holder takes the lock on the master and waits before its
	// write, past its one Lost check.
	c, first := d.enter(ctx, r1, atBeforeWrite, "held")
	if c == nil {
		return nil
	}
	defer c.Answer()
	if has, err := hasKey(ctx, rc, lockKey); err != nil || has {
		c.Answer()
		d.wait(ctx, first, 2*lockWait)
		return fmt.Errorf("replication was not cut: the replica has %s (%v, %v)", lockKey, has, err)
	}
	t0 := time.Now()
	if err := f.master.Kill(); err != nil {
		return err
	}
	run.Fired("%s holds the lock on the master only (the replica has no key, its counter is at %d); master killed (SIGKILL) %s after the cut", c, replicaFence, since(tCut))

	if err := waitFor(ctx, 30*time.Second, "promotion", f.promoted); err != nil {
		return err
	}
	promotedFence := counter(ctx, rc, fenceKey)
	has, _ := hasKey(ctx, rc, lockKey)
	how := "sentinels promoted the replica %s after the kill (+switch-master)"
	if f.cluster != nil {
		how = "the cluster failed over to the replica %s after the kill (its vote, cluster-node-timeout " + testbed.RedisClusterNodeTimeout.String() + ")"
	}
	run.Eventf(how+"; it has the lock key: %v, its fence counter is at %d where the old master's was at %d", since(t0), has, promotedFence, c.Token)
	if due := c.Arrived.Add(f.ttl / 3); time.Now().After(due) {
		run.Eventf("the promotion came after %s's first renewal was due (TTL/3 after its grant): that renewal may have found its lease gone before a second holder was granted", c.Replica)
	}

	// The second holder takes the same lock on the promoted replica. Its
	// replica may need a moment to follow the sentinels (an answer 503
	// lock_unavailable): try again.
	var c2 *hookCall
	var second *sent
	for try := 1; ; try++ {
		name := fmt.Sprintf("second-%d", try)
		var s *sent
		if c2, s, err = d.sendCaught(ctx, r2, atBeforeWrite, name, 2*lockWait); err == nil {
			second = s
			break
		}
		d.wait(ctx, s, lockWait) // says what it was answered
		run.Eventf("%s had not yet followed the failover; trying again", r2.Name)
		if try == afterOrders || clock.Sleep(ctx, 200*time.Millisecond) != nil {
			run.Eventf("no second holder of %s after the failover: %v", run.FaultSKU, err)
			c.Answer()
			d.wait(ctx, first, 2*lockWait)
			return nil
		}
	}
	run.Eventf("%s holds the same lock on the promoted replica %s after the kill, while %s still holds it: two holders. Its token %d comes from the promoted replica's counter: the old master had handed out tokens up to %d", c2, since(t0), c.Replica, c2.Token, c.Token)

	// The second holder writes first, then the first.
	c2.Answer()
	p2 := d.wait(ctx, second, 3*lockWait)
	placedAt := time.Time{}
	if ordered(p2) {
		placedAt = time.Now()
	}
	c.Answer()
	d.wait(ctx, first, 3*lockWait)

	// Orders after the failover until one is placed: under guard fencing,
	// every token at or below MySQL's fence is refused.
	refused := 0
	if staleToken(p2) {
		refused++
	}
	for i := 1; placedAt.IsZero() && i < afterOrders; i++ {
		p := d.wait(ctx, d.send(ctx, r2, fmt.Sprintf("after-%d", i)), 3*lockWait)
		if ordered(p) {
			placedAt = time.Now()
		} else if staleToken(p) {
			refused++
		}
	}
	fence, ferr := mysqlFence(ctx, run.Servers.MySQLDSN, run.FaultSKU)
	now := counter(ctx, rc, fenceKey)
	tokens := fmt.Sprintf("the promoted replica's fence counter went on from %d, %d behind the %d the old master had reached: it handed out tokens %d to %d again", promotedFence, c.Token-promotedFence, c.Token, promotedFence+1, min(now, c.Token))
	switch {
	case ferr != nil:
		run.Eventf("%s (MySQL's fence unread: %v)", tokens, ferr)
	case run.Spec.Guard == "fencing":
		run.Eventf("%s; MySQL's fence was %d when token %d came (then %d, the first holder's), so guard fencing refused %d order(s) until the counter passed it (fence now %d): safe, not available meanwhile", tokens, fenceBefore, c2.Token, c.Token, refused, fence)
	default:
		run.Eventf("%s; guard %s does not compare tokens (MySQL's fence column stays %d)", tokens, run.Spec.Guard, fence)
	}
	if placedAt.IsZero() {
		run.Eventf("no order on %s placed within %d tries after the failover", run.FaultSKU, afterOrders)
	} else {
		run.Recovered(placedAt.Sub(t0))
		run.Eventf("first order placed on %s %s after the kill", run.FaultSKU, placedAt.Sub(t0).Round(time.Millisecond))
	}
	return nil
}

// warm places warmOrders orders on the fault SKU through r while
// replication runs, and waits for the replica to have them (their grants,
// their stock). false: one was not placed (the run's events say so), or
// the wait failed (err).
func warm(ctx context.Context, run *loadtest.Run, d *driver, r *loadtest.Replica, mc *redis.Client) (bool, error) {
	for i := range warmOrders {
		if p := quietly(ctx, run, d, r, fmt.Sprintf("warm-%d", i+1)); !ordered(p) {
			notFired(run, fmt.Errorf("an order before the cut was not placed (status %d %s)", p.status, p.code))
			return false, nil
		}
	}
	if _, err := mc.Wait(ctx, 1, 2*time.Second).Result(); err != nil {
		return false, fmt.Errorf("wait for the replica: %w", err)
	}
	return true, nil
}

// cut cuts replication where Sentinel cannot repair it, its user (off, its
// connections killed on the master mc), and returns when the replica's
// link is down, with the time of the cut.
func (f *failover) cut(ctx context.Context, mc *redis.Client) (time.Time, error) {
	if err := mc.Do(ctx, "ACL", "SETUSER", replUser, "off").Err(); err != nil {
		return time.Time{}, fmt.Errorf("cut replication: %w", err)
	}
	if err := mc.Do(ctx, "CLIENT", "KILL", "USER", replUser).Err(); err != nil {
		return time.Time{}, fmt.Errorf("cut replication: %w", err)
	}
	t := time.Now()
	return t, waitFor(ctx, 5*time.Second, "replica link down", func(ctx context.Context) error {
		return infoHas(ctx, f.replica.Addr, "replication", "master_link_status:down")
	})
}

// quietly places a driven order on the fault SKU through r and waits for
// it, as driver.wait does but without an event of its own.
func quietly(ctx context.Context, run *loadtest.Run, d *driver, r *loadtest.Replica, name string) placed {
	p := place(ctx, d.client, r.URL, run.FaultSKU, run.KeyPrefix+"-"+name)
	if ordered(p) {
		run.Acked(p.id)
	}
	return p
}

// ordered: a driven order was placed.
func ordered(p placed) bool {
	return p.status == http.StatusCreated || p.status == http.StatusOK
}

// staleToken: an order refused by the fencing guard (409 lock_lost).
func staleToken(p placed) bool {
	return p.status == http.StatusConflict && p.code == "lock_lost"
}

// counter reads a fence counter (0 when absent or unreadable).
func counter(ctx context.Context, c *redis.Client, key string) uint64 {
	n, _ := c.Get(ctx, key).Uint64()
	return n
}

// mysqlFence is the fence MySQL keeps for sku (the guard fencing's).
func mysqlFence(ctx context.Context, dsn, sku string) (uint64, error) {
	n, err := inventoryColumn(ctx, dsn, "fence", sku)
	return uint64(n), err
}

// inventoryColumn reads one column ("stock", "fence") of sku's row.
func inventoryColumn(ctx context.Context, dsn, column, sku string) (int64, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int64
	err = db.QueryRowContext(ctx, "SELECT "+column+" FROM inventory WHERE sku = ?", sku).Scan(&n)
	return n, err
}

// waitFor polls check every 50ms until it returns nil, for at most limit.
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
		if clock.Sleep(ctx, 50*time.Millisecond) != nil {
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

func hasKey(ctx context.Context, c *redis.Client, key string) (bool, error) {
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

// promoted: the replica is the master now, for the sentinels or the cluster.
func (f *failover) promoted(ctx context.Context) error {
	if f.cluster != nil {
		return clusterPromoted(ctx, f)
	}
	return sentinelPromoted(ctx, f.sentinels[0].Addr, f.replica.Addr)
}

// replicaClient is a one-connection client for the replica; a cluster
// replica answers reads of its own data only after READONLY.
func (f *failover) replicaClient(ctx context.Context) *redis.Client {
	c := client(f.replica.Addr)
	if f.cluster != nil {
		_ = c.Do(ctx, "READONLY").Err()
	}
	return c
}

// sentinelPromoted: the sentinel names want as the master, and want says it is one.
func sentinelPromoted(ctx context.Context, sentinel, want string) error {
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
