// Package testbed starts private real servers (MariaDB, Redis, Redis
// Sentinel, ZooKeeper, etcd) from the Debian packages as child processes,
// each in its own directory on a free 127.0.0.1 port, waits until each
// answers its own protocol, and stops and removes them.
//
// The core API (StartRedis, Server.Kill, Server.Restart, ...) needs no
// testing.T: cmd/lab and fault injection use it directly. The test helpers
// (Main, MySQL, Redis, Redises, ZooKeeper, Etcd, Prefix) wrap it for tests:
// MariaDB, ZooKeeper and etcd are shared per test binary and started lazily;
// Redis is cheap, so every test gets its own.
//
// Addresses given in the environment take precedence over starting servers:
//
//	OVERSOLD_TEST_MYSQL_DSN       a server DSN (go-sql-driver); MySQL(t) still creates a fresh database on it
//	OVERSOLD_TEST_REDIS_ADDR      host:port returned by Redis(t)
//	OVERSOLD_TEST_REDLOCK_ADDRS   comma-separated host:port list; Redises(t, n) returns the first n
//	OVERSOLD_TEST_ZK_SERVERS      comma-separated host:port list returned by ZooKeeper(t)
//	OVERSOLD_TEST_ETCD_ENDPOINTS  comma-separated endpoints returned by Etcd(t)
//	OVERSOLD_REQUIRE_SERVERS=1    a missing server binary fails the test instead of skipping it
//
// Proxy (StartProxy) is a toxiproxy in this process that cuts or slows one
// path to a server. A cluster started with ClusterOptions.ClientProxies has
// one in front of each node (Cluster.Clients), which its nodes announce, so
// a test cuts one node off from its clients alone.
//
// Given servers are shared with other tests and runs, so tests must keep to
// their own Prefix(t) and database.
//
// Children die with this process (Pdeathsig) unless Options.Detach is set;
// Main also stops the shared servers and removes their directories. While a
// server runs, testbed keeps a goroutine waiting for it: tests checking for
// leaks pass GoleakOptions() to goleak.
package testbed // import "github.com/oversold-lab/oversold/internal/testbed"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/goleak"
)

// Kinds of server.
const (
	KindMariaDB   = "mariadb"
	KindRedis     = "redis"
	KindSentinel  = "sentinel"
	KindZooKeeper = "zookeeper"
	KindEtcd      = "etcd"
)

const (
	// startTimeout bounds one start, including retries on a taken port: a JVM
	// or InnoDB on a busy 2-core box can take many seconds.
	startTimeout = 60 * time.Second
	stopTimeout  = 15 * time.Second
	portAttempts = 4
)

// ErrMissing is wrapped by a Start function when the server binary is absent.
var ErrMissing = errors.New("testbed: server not installed")

// Server is one private server process.
type Server struct {
	Kind string // "mariadb", "redis", "sentinel", "zookeeper", "etcd"
	Addr string // 127.0.0.1:port clients connect to
	Dir  string // its private directory (data, config, log)

	opts   Options
	spec   spec
	ownDir bool
	ports  []int // ports[0] is Addr's; etcd also has a peer port

	mu      sync.Mutex
	ctr     *ctr // the container, when the container provider runs it (container.go)
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd has been waited for
	waitErr error         // set before exited is closed
	removed bool
}

// Options tune a server start. The zero value is a fresh temp dir on a free
// port, with the server dying along with this process.
type Options struct {
	Dir  string   // "" = a new temp dir, removed by Stop
	Port int      // 0 = a free port
	Args []string // extra server arguments, appended after testbed's own so they win (e.g. redis "--replicaof 127.0.0.1 1234"); for ZooKeeper, "-..." are JVM options and "key=value" are zoo.cfg lines
	Env  []string // extra environment (e.g. LD_PRELOAD/FAKETIME for libfaketime)
	// Detach lets the server survive this process (lab --keep). By default
	// the child is killed when we die (SysProcAttr.Pdeathsig = SIGKILL).
	Detach bool
	// Log receives server output in addition to the log file in Dir. Ignored
	// with Detach: a pipe to this process would break when it exits.
	Log io.Writer
}

// spec is what differs between kinds.
type spec struct {
	kind   string
	nports int
	// setup prepares Dir for a first start on s.ports (configs, install).
	setup func(ctx context.Context, s *Server) error
	argv  func(s *Server) []string
	// ready reports whether the server answers its own protocol.
	ready func(ctx context.Context, s *Server) error
	// ctr is what the container provider runs instead (container.go).
	ctr func(s *Server) ctrSpec
}

// binaries lists what each kind needs, and the package providing it.
var binaries = map[string]struct {
	files []string
	pkg   string
}{
	KindMariaDB:   {[]string{"mariadbd", "mariadb-install-db"}, "mariadb-server"},
	KindRedis:     {[]string{"redis-server"}, "redis-server"},
	KindSentinel:  {[]string{"redis-sentinel"}, "redis-sentinel"},
	KindZooKeeper: {[]string{"java", zkJar}, "zookeeper"},
	KindEtcd:      {[]string{"etcd"}, "etcd-server"},
}

// Missing reports the Debian install command when a server binary is absent,
// e.g. "apt-get install -y mariadb-server"; "" when present, or when the
// container provider runs kind (OVERSOLD_TESTBED).
func Missing(kind string) string {
	b, ok := binaries[kind]
	if !ok {
		return fmt.Sprintf("testbed: unknown server kind %q", kind)
	}
	if in, err := containerized(kind); in || err != nil {
		return "" // start says what is wrong
	}
	for _, f := range b.files {
		if _, err := lookPath(f); err != nil {
			return "apt-get install -y " + b.pkg
		}
	}
	return ""
}

// lookPath also searches the sbin directories, which are not on a normal
// user's PATH but hold mariadbd.
func lookPath(name string) (string, error) {
	if filepath.IsAbs(name) {
		if _, err := os.Stat(name); err != nil {
			return "", err
		}
		return name, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/sbin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}

func mustPath(name string) string {
	if p, err := lookPath(name); err == nil {
		return p
	}
	return name
}

// start runs sp with o: Dir, setup, launch, and a retry on a fresh port when
// another process took the one picked (packages' tests run in parallel).
func start(ctx context.Context, sp spec, o Options) (*Server, error) {
	inContainer, err := containerized(sp.kind)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", sp.kind, err)
	}
	inContainer = inContainer && sp.ctr != nil // a spec without a container form runs as a process
	if cmd := Missing(sp.kind); cmd != "" {
		return nil, fmt.Errorf("start %s: %w: %s", sp.kind, ErrMissing, cmd)
	}
	timeout := startTimeout
	if inContainer {
		timeout = containerStartTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	s := &Server{Kind: sp.kind, Dir: o.Dir, opts: o, spec: sp}
	if s.Dir == "" {
		d, err := os.MkdirTemp("", "testbed-"+sp.kind+"-")
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", sp.kind, err)
		}
		s.Dir, s.ownDir = d, true
	} else if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("start %s: %w", sp.kind, err)
	}
	// MariaDB's socket path must stay short and etcd wants absolute URLs.
	if d, err := filepath.Abs(s.Dir); err == nil {
		s.Dir = d
	}

	for attempt := 1; ; attempt++ {
		ports, err := freePorts(sp.nports, o.Port)
		if err == nil {
			s.ports = ports
			s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
			err = s.run(ctx, inContainer)
		}
		if err == nil {
			return s, nil
		}
		if o.Port == 0 && attempt < portAttempts && errors.Is(err, errPortTaken) && ctx.Err() == nil {
			continue
		}
		if s.ownDir {
			os.RemoveAll(s.Dir)
		}
		return nil, fmt.Errorf("start %s: %w", sp.kind, err)
	}
}

// run starts s on s.ports: a container, or setup and a process.
func (s *Server) run(ctx context.Context, inContainer bool) error {
	if inContainer {
		return s.runContainer(ctx)
	}
	if err := s.spec.setup(ctx, s); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launch(ctx)
}

// errPortTaken marks a start that failed because the port was taken.
var errPortTaken = errors.New("port taken")

var (
	portsMu sync.Mutex
	given   = map[int]bool{} // never hand out one port twice in this process
)

// freePorts picks n free loopback ports (the first being fixed if nonzero),
// by letting the kernel choose. Another process may still take one before
// the server binds it: start retries on errPortTaken.
func freePorts(n, fixed int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	var ports []int
	if fixed != 0 {
		ports = append(ports, fixed)
	}
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100 {
			return nil, errors.New("no free port")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if given[p] {
			continue
		}
		given[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

func (s *Server) logPath() string { return filepath.Join(s.Dir, s.Kind+".log") }

// launch starts the process on s.ports and waits until it is ready. Callers
// hold s.mu.
func (s *Server) launch(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	off, _ := logf.Seek(0, io.SeekEnd)

	argv := s.spec.argv(s)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), s.opts.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if s.opts.Log != nil && !s.opts.Detach {
		w := io.MultiWriter(logf, s.opts.Log)
		cmd.Stdout, cmd.Stderr = w, w
		cmd.WaitDelay = 2 * time.Second // a forked BGSAVE child may hold the pipe
	}
	cmd.SysProcAttr = sysProcAttr(s.opts.Detach)
	if err := spawn(cmd); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	s.cmd, s.exited, s.waitErr = cmd, exited, nil
	go s.reap(cmd, logf, exited)

	if err := s.waitReady(ctx, cmd.Process.Pid, exited); err != nil {
		cmd.Process.Kill()
		<-exited
		tail := logTail(s.logPath(), off)
		if strings.Contains(strings.ToLower(tail), "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		where := "log tail"
		if !s.ownDir { // testbed removes its own dirs after a failed start
			where = "tail of " + s.logPath()
		}
		return fmt.Errorf("%w; %s:\n%s", err, where, tail)
	}
	return nil
}

// reap waits for the process to exit. Named, so GoleakOptions can name it.
func (s *Server) reap(cmd *exec.Cmd, logf *os.File, exited chan struct{}) {
	err := cmd.Wait()
	logf.Close()
	s.waitErr = err // read only after <-exited
	close(exited)
}

// waitReady polls until the process owns its listening port and answers its
// protocol. Owning the port matters: when the port was taken, a foreign
// server would answer the ping before ours fails to bind.
func (s *Server) waitReady(ctx context.Context, pid int, exited <-chan struct{}) error {
	delay := 10 * time.Millisecond
	var last error
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited before ready: %v", s.Kind, s.waitErr)
		default:
		}
		if err := listening(pid, s.ports[0]); err != nil {
			last = err
		} else {
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			last = s.spec.ready(pctx, s)
			cancel()
			if last == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before ready: %v", s.Kind, s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %v)", s.Kind, ctx.Err(), last)
		case <-time.After(delay):
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// logTail returns the last lines the server wrote since offset.
func logTail(path string, off int64) string {
	const limit = 4096
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	from := max(off, end-limit)
	buf := make([]byte, end-from)
	n, _ := f.ReadAt(buf, from)
	buf = buf[:n]
	if from > off {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		}
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// running reports whether the process is alive. Callers hold s.mu.
func (s *Server) running() bool {
	if s.ctr != nil {
		return s.ctrRunning()
	}
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Pid is the server's process id, 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctr != nil {
		return s.ctrPid()
	}
	if !s.running() {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop asks the server to shut down (SIGTERM), waits for it for a bounded
// time, then kills it, and removes Dir if testbed made it. Stopping a
// stopped server only removes its Dir.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctr != nil {
		return s.ctrStop()
	}
	var err error
	if s.running() {
		p := s.cmd.Process
		p.Signal(syscall.SIGTERM)
		p.Signal(syscall.SIGCONT) // a paused server would never see the SIGTERM
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			p.Kill()
			<-s.exited
			err = fmt.Errorf("stop %s %s: killed after %v", s.Kind, s.Addr, stopTimeout)
		}
	}
	if s.ownDir && !s.removed {
		s.removed = true
		if rerr := os.RemoveAll(s.Dir); rerr != nil && err == nil {
			err = fmt.Errorf("stop %s: %w", s.Kind, rerr)
		}
	}
	return err
}

// Kill sends SIGKILL now and waits for the process to go, keeping Dir and
// port for a Restart.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running() {
		return nil
	}
	if s.ctr != nil {
		return s.ctrKill()
	}
	if err := s.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", s.Kind, err)
	}
	<-s.exited
	return nil
}

// Restart starts the server again on the same port and Dir after Kill, or
// after Stop when Dir was given in Options, and waits until it is ready.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running() {
		return fmt.Errorf("restart %s %s: still running", s.Kind, s.Addr)
	}
	if s.removed {
		return fmt.Errorf("restart %s %s: stopped and its directory removed", s.Kind, s.Addr)
	}
	if s.ctr != nil {
		if err := s.ctrRestart(ctx); err != nil {
			return fmt.Errorf("restart %s %s: %w", s.Kind, s.Addr, err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := s.launch(ctx); err != nil {
		return fmt.Errorf("restart %s %s: %w", s.Kind, s.Addr, err)
	}
	return nil
}

// Pause stops the process in its tracks (SIGSTOP): connections stay open and
// nothing answers, like a long GC pause.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running() {
		return fmt.Errorf("signal %s %s: not running", s.Kind, s.Addr)
	}
	if s.ctr != nil { // SIGSTOP and SIGCONT: the cgroup freezer
		if err := s.ctrPause(sig == syscall.SIGSTOP); err != nil {
			return fmt.Errorf("signal %s %s: %w", s.Kind, s.Addr, err)
		}
		return nil
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s %s: %w", s.Kind, s.Addr, err)
	}
	return nil
}

// String names the server for logs.
func (s *Server) String() string { return s.Kind + "@" + s.Addr }

var (
	spawnOnce sync.Once
	spawnc    chan func()
)

// spawn starts cmd from one OS thread that never exits. Pdeathsig fires when
// the parent *thread* dies, not the process (golang/go#27505), and Go may
// retire the thread a goroutine ran on; this one is locked for good.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnc = make(chan func())
		go spawnLoop()
	})
	errc := make(chan error, 1)
	spawnc <- func() { errc <- cmd.Start() }
	return <-errc
}

func spawnLoop() {
	runtime.LockOSThread() // never unlocked: the thread lives as long as we do
	for f := range spawnc {
		f()
	}
}

// GoleakOptions ignores the goroutines testbed keeps while servers run (one
// per process, and the spawning thread), for goleak.VerifyNone and
// goleak.VerifyTestMain; and the one toxiproxy v2.5.0 can leave behind
// when a toxic's removal races the proxy's stop (Proxy.Restore, then
// Close): the pipe of the removed toxic, blocked for good sending to a
// link that stopped reading. Any other goroutine of a proxy left running
// is still reported.
func GoleakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/oversold-lab/oversold/internal/testbed.(*Server).reap"),
		goleak.IgnoreAnyFunction("github.com/oversold-lab/oversold/internal/testbed.spawnLoop"),
		goleak.IgnoreAnyFunction("github.com/oversold-lab/oversold/internal/testbed.waitReaper"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
	}
}
