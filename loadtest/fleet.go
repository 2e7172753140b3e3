package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FleetConfig describes N replicas of orderd that share one configuration.
type FleetConfig struct {
	Binary   string              // the orderd executable
	Replicas int                 // how many; they are named r1, r2, ...
	Env      map[string]string   // OVERSOLD_* settings for all; ADDR and INSTANCE are set per replica
	Each     []map[string]string // Each[i], if any, adds to or overrides Env for replica i only
	LogDir   string              // each replica's stdout and stderr go to LogDir/<name>.log
	Ready    time.Duration       // how long a replica may take to answer /readyz; 0 means 30s
}

// Fleet is a set of running orderd processes. Faults act on its replicas one
// by one; Stop ends them all.
type Fleet struct {
	Replicas []*Replica

	cfg   FleetConfig
	mu    sync.Mutex   // Add's: it may run concurrently with itself
	names int          // replicas named so far
	ports map[int]bool // ports given to replicas so far
}

// Replica is one orderd OS process on its own loopback port.
type Replica struct {
	Name string // OVERSOLD_INSTANCE: r1, r2, ...
	URL  string // http://127.0.0.1:port
	Log  string // its log file

	cfg  FleetConfig
	env  map[string]string // cfg.Env with cfg.Each[i] over it
	addr string

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current process has exited
	waitErr  error         // how it exited, once exited is closed
	stopping bool          // we asked it to end: its exit is not a crash
}

// StartFleet starts cfg.Replicas processes at once and returns when every one
// answers /readyz. If any fails, the others are stopped and the error quotes
// the failing replica's last log lines (orderd names the bad setting there).
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Replicas <= 0 {
		return nil, errors.New("fleet: no replicas")
	}
	if cfg.Ready <= 0 {
		cfg.Ready = 30 * time.Second
	}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	f := &Fleet{cfg: cfg}
	for i := range cfg.Replicas {
		r, err := f.newReplica(cfg.env(i))
		if err != nil {
			return nil, err
		}
		f.Replicas = append(f.Replicas, r)
	}
	errs := make([]error, len(f.Replicas))
	var wg sync.WaitGroup
	for i, r := range f.Replicas {
		wg.Go(func() { errs[i] = r.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
		return nil, err
	}
	return f, nil
}

// newReplica names the next replica and picks its port, one no replica of
// the fleet has: the kernel may hand a probed port out again before anyone
// binds it, and a replica that then fails to bind would look ready through
// the other one's /readyz (seen once in 240 lab runs: a retry refused).
func (f *Fleet) newReplica(env map[string]string) (*Replica, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	port, err := pickPort()
	for err == nil && f.ports[port] {
		port, err = pickPort()
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if f.ports == nil {
		f.ports = map[int]bool{}
	}
	f.ports[port] = true
	f.names++
	name := fmt.Sprintf("r%d", f.names)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return &Replica{
		Name: name,
		URL:  "http://" + addr,
		Log:  filepath.Join(f.cfg.LogDir, name+".log"),
		cfg:  f.cfg,
		env:  env,
		addr: addr,
	}, nil
}

// Add starts one more replica, as a rolling update's newcomer does, with
// over added to or overriding the fleet's Env, and waits until it answers
// /readyz. It joins Replicas only then; a newcomer that fails is returned,
// stopped, with the error. Adds may run at once; nothing else may run
// with them.
func (f *Fleet) Add(ctx context.Context, over map[string]string) (*Replica, error) {
	env := maps.Clone(f.cfg.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, over)
	r, err := f.newReplica(env)
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = r.Stop(stopCtx)
		return r, err
	}
	f.mu.Lock()
	f.Replicas = append(f.Replicas, r)
	f.mu.Unlock()
	return r, nil
}

// env is replica i's settings: Env, then Each[i] over it.
func (cfg FleetConfig) env(i int) map[string]string {
	if i >= len(cfg.Each) || len(cfg.Each[i]) == 0 {
		return cfg.Env
	}
	env := maps.Clone(cfg.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, cfg.Each[i])
	return env
}

// URLs lists the replicas' base URLs.
func (f *Fleet) URLs() []string {
	urls := make([]string, len(f.Replicas))
	for i, r := range f.Replicas {
		urls[i] = r.URL
	}
	return urls
}

// Stop ends every replica: SIGTERM for a graceful shutdown, SIGKILL for any
// still running when ctx ends.
func (f *Fleet) Stop(ctx context.Context) error {
	errs := make([]error, len(f.Replicas))
	var wg sync.WaitGroup
	for i, r := range f.Replicas {
		wg.Go(func() { errs[i] = r.Stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Crashed describes every replica that exited without being asked to, or "".
func (f *Fleet) Crashed() string {
	var out []string
	for _, r := range f.Replicas {
		if why := r.crashed(); why != "" {
			out = append(out, why)
		}
	}
	return strings.Join(out, "; ")
}

// Start starts the replica's process (again, after Kill or Stop: same name,
// port and log file) and waits until it answers /readyz.
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.cmd != nil && !isClosed(r.exited) {
		r.mu.Unlock()
		return fmt.Errorf("replica %s: already running", r.Name)
	}
	logf, err := os.OpenFile(r.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.mu.Unlock()
		return fmt.Errorf("replica %s: %w", r.Name, err)
	}
	cmd := exec.Command(r.cfg.Binary)
	cmd.Env = replicaEnv(os.Environ(), r.env, r.addr, r.Name)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		logf.Close()
		return fmt.Errorf("replica %s: %w", r.Name, err)
	}
	exited := make(chan struct{})
	r.cmd, r.exited, r.stopping, r.waitErr = cmd, exited, false, nil
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		r.mu.Lock()
		r.waitErr = err
		r.mu.Unlock()
		close(exited)
	}()
	return r.waitReady(ctx, exited)
}

// waitReady polls /readyz until it answers 200, the process exits, or the
// ready timeout passes.
func (r *Replica) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Ready)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/readyz", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			r.mu.Lock()
			err := r.waitErr
			r.mu.Unlock()
			return fmt.Errorf("replica %s exited at start (%v): %s", r.Name, err, r.tail())
		case <-ctx.Done():
			r.Kill()
			return fmt.Errorf("replica %s not ready after %s: %s", r.Name, r.cfg.Ready, r.tail())
		case <-tick.C:
		}
	}
}

// Pause stops the process in its tracks (SIGSTOP), as a long GC pause would.
func (r *Replica) Pause() error { return r.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (r *Replica) Resume() error { return r.signal(syscall.SIGCONT) }

// Kill ends the process at once (SIGKILL), as a crash would, and waits for it.
func (r *Replica) Kill() error {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	if err := r.signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-r.done()
	return nil
}

// Stop asks the process to shut down (SIGTERM) and kills it if ctx ends first.
func (r *Replica) Stop(ctx context.Context) error {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	_ = r.signal(syscall.SIGCONT) // a paused process cannot act on SIGTERM
	if err := r.signal(syscall.SIGTERM); err != nil {
		return nil // not running
	}
	select {
	case <-r.done():
		return nil
	case <-ctx.Done():
		_ = r.signal(syscall.SIGKILL)
		<-r.done()
		return fmt.Errorf("replica %s: killed after SIGTERM was not enough: %w", r.Name, ctx.Err())
	}
}

// Pid is the current process id, or 0 when none has started.
func (r *Replica) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
}

func (r *Replica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || isClosed(r.exited) {
		return fmt.Errorf("replica %s: not running", r.Name)
	}
	return r.cmd.Process.Signal(sig)
}

// done is closed once the current process has exited.
func (r *Replica) done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return r.exited
}

func (r *Replica) crashed() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited == nil || r.stopping || !isClosed(r.exited) {
		return ""
	}
	return fmt.Sprintf("replica %s exited (%v): %s", r.Name, r.waitErr, r.tail())
}

// tail is the last lines of the replica's log, on one line.
func (r *Replica) tail() string {
	b, err := os.ReadFile(r.Log)
	if err != nil {
		return "no log: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(bytes.ToValidUTF8(b, nil))), "\n")
	lines = lines[max(0, len(lines)-3):]
	if len(lines) == 1 && lines[0] == "" {
		return "log " + r.Log + " is empty"
	}
	return strings.Join(lines, " | ")
}

// replicaEnv is the parent's environment without any OVERSOLD_* variable (a
// developer's shell must not leak into the experiment), plus settings.
func replicaEnv(parent []string, settings map[string]string, addr, name string) []string {
	env := slices.DeleteFunc(slices.Clone(parent), func(kv string) bool {
		return strings.HasPrefix(kv, "OVERSOLD_")
	})
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+settings[k])
	}
	return append(env, "OVERSOLD_ADDR="+addr, "OVERSOLD_INSTANCE="+name)
}

// pickPort is freePort; tests replace it.
var pickPort = freePort

// freePort asks the kernel for an unused loopback port. Another process could
// take it before the replica binds it; the replica then fails at start and
// says so.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
