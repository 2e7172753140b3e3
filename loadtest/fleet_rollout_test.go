package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oversold-lab/oversold/internal/testbed"
)

// TestRollingUpdate runs the rolling updates of deploy/k8s (maxSurge 1,
// maxUnavailable 0) on real orderd processes: three replicas serve; a
// newcomer with another guard, and then two at once with another lock and
// guard, are refused at start (exit 2 naming the settings) while the three
// stay ready and sell throughout; a newcomer with the same settings (a new
// image) becomes ready and sells. Then every replica dies by SIGKILL: their
// rows hold the next newcomer with other settings back only until they go
// stale, not forever.
func TestRollingUpdate(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "orderd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/oversold-lab/oversold/cmd/orderd").CombinedOutput(); err != nil {
		t.Fatalf("build orderd: %v\n%s", err, out)
	}
	const token = "rollout-token"
	f, err := StartFleet(t.Context(), FleetConfig{
		Binary:   bin,
		Replicas: 3,
		Env: map[string]string{
			"OVERSOLD_MYSQL_DSN": testbed.MySQL(t), "OVERSOLD_REDIS_ADDR": testbed.Redis(t),
			"OVERSOLD_LOCK": "redis", "OVERSOLD_GUARD": "version", "OVERSOLD_ADMIN_TOKEN": token,
		},
		LogDir: t.TempDir(),
		Ready:  20 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Stop(context.Background()) })
	old := f.Replicas
	if err := ResetStock(t.Context(), old[0].URL, token, "roll-1", 1000); err != nil {
		t.Fatal(err)
	}

	// Every 50ms each old replica is asked /readyz until the newcomers are
	// done: not one answer may be other than 200.
	var unready atomic.Int64
	var firstUnready atomic.Value
	watching, stopWatching := context.WithCancel(t.Context())
	var watch sync.WaitGroup
	for _, r := range old {
		watch.Go(func() {
			for watching.Err() == nil {
				if code, body := httpGet(r.URL + "/readyz"); code != http.StatusOK {
					unready.Add(1)
					firstUnready.CompareAndSwap(nil, fmt.Sprintf("%s: %d %s", r.Name, code, body))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}

	refused := func(r *Replica, err error, want string) {
		t.Helper()
		if err == nil {
			t.Errorf("newcomer %s with other settings became ready", r.Name)
			return
		}
		if !strings.Contains(err.Error(), "exited at start (exit status 2)") || !strings.Contains(err.Error(), want) {
			t.Errorf("newcomer refused with %v, want exit status 2 naming %q", err, want)
		}
	}
	r, err := f.Add(t.Context(), map[string]string{"OVERSOLD_GUARD": "atomic"})
	refused(r, err, "OVERSOLD_LOCK, OVERSOLD_GUARD, OVERSOLD_GATE, OVERSOLD_ACCEPT: replicas of one database run other settings: live replica r1 runs lock=redis guard=version, this one lock=redis guard=atomic")
	sells(t, old, "after one refused newcomer")

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			r, err := f.Add(t.Context(), map[string]string{"OVERSOLD_LOCK": "mysql", "OVERSOLD_GUARD": "fencing"})
			refused(r, err, "this one lock=mysql guard=fencing")
		})
	}
	wg.Wait()
	stopWatching()
	watch.Wait()
	if n := unready.Load(); n > 0 {
		t.Errorf("the serving replicas answered /readyz other than 200 %d times while newcomers were refused; first: %v", n, firstUnready.Load())
	}
	sells(t, old, "after two refused newcomers at once")

	same, err := f.Add(t.Context(), nil)
	if err != nil {
		t.Fatalf("a newcomer with the same settings: %v", err)
	}
	sells(t, append(old, same), "with the same-settings newcomer")

	// A crash leaves rows behind; they count until they go stale.
	for _, r := range f.Replicas {
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	next := map[string]string{"OVERSOLD_GUARD": "atomic"}
	r, err = f.Add(t.Context(), next)
	refused(r, err, "live replica r1 runs lock=redis guard=version, this one lock=redis guard=atomic")
	time.Sleep(time.Until(killed.Add(16 * time.Second))) // orderd's liveWithin (15s) and a margin
	if _, err := f.Add(t.Context(), next); err != nil {
		t.Errorf("a newcomer with other settings once the dead replicas' rows are stale: %v", err)
	}
}

// sells places one order on each replica and wants 201 from all.
func sells(t *testing.T, rs []*Replica, when string) {
	t.Helper()
	for _, r := range rs {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, r.URL+"/v1/orders", strings.NewReader(`{"sku":"roll-1","quantity":1}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", r.Name, when, err)
			continue
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Errorf("%s %s: POST /v1/orders = %d %s, want 201", r.Name, when, res.StatusCode, b)
		}
	}
}

// httpGet returns the status and body of a GET, or 0 and the error.
func httpGet(url string) (int, string) {
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	res, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
