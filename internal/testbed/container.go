package testbed

// The container provider: the same servers as the process provider, run as
// containers through testcontainers-go (docs/design.md, "Test servers").
//
// Every container shares the host's network namespace and its server binds
// 127.0.0.1 on a port testbed picked, exactly like a process. That is on
// purpose: Redis replication, Sentinel, Redis Cluster and ZooKeeper/etcd
// peers announce the address a server sees itself at, and with host
// networking that is the address clients dial; published ports would need
// an announce setting per server kind. It needs a Linux engine (dockerd on
// this machine or a VM's own), not Docker Desktop's port forwarding.
//
// Nothing is left behind: Ryuk (testcontainers' reaper) is off unless
// TESTCONTAINERS_RYUK_DISABLED says otherwise, because its image comes from
// a registry; instead every container carries this process's session label,
// a reaper child process (this same executable, see reaper.go) removes them
// when this process dies however it dies, Main removes them at exit, and
// containers of sessions whose process is gone are removed at the first
// start.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/pkg/stdcopy"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Provider settings (docs/design.md, "Test servers").
const (
	EnvTestbed         = "OVERSOLD_TESTBED" // process, containers or auto (default)
	ProviderProcess    = "process"
	ProviderContainers = "containers"
	ProviderAuto       = "auto"
)

// images: the official image of each kind and the variable replacing it.
var images = map[string]struct{ env, official string }{
	KindMariaDB:   {"OVERSOLD_IMAGE_MYSQL", "mysql:8.4"},
	KindRedis:     {"OVERSOLD_IMAGE_REDIS", "redis:7"},
	KindSentinel:  {"OVERSOLD_IMAGE_REDIS", "redis:7"},
	KindZooKeeper: {"OVERSOLD_IMAGE_ZOOKEEPER", "zookeeper:3.9"},
	KindEtcd:      {"OVERSOLD_IMAGE_ETCD", "quay.io/coreos/etcd:v3.5.21"},
}

// Image is the image the container provider runs for kind: the
// OVERSOLD_IMAGE_* variable, or the official image.
func Image(kind string) string {
	im := images[kind]
	if v := os.Getenv(im.env); v != "" {
		return v
	}
	return im.official
}

// Labels on every container testbed starts.
const (
	labelTestbed = "oversold.testbed"         // the kind
	labelSession = "oversold.testbed.session" // "<pid>-<random>": removed when that process is gone
	labelKeep    = "oversold.testbed.keep"    // Options.Detach: never reaped
)

// containerStartTimeout bounds a container start after its image is there:
// the official MySQL image initialises its data directory first.
const containerStartTimeout = 3 * time.Minute

// containerized reports whether servers of kind run as containers, from
// OVERSOLD_TESTBED: containers needs an engine (an error otherwise); auto
// takes containers when an engine answers and the image is there or can be
// pulled. Decided once per kind.
func containerized(kind string) (bool, error) {
	mode := os.Getenv(EnvTestbed)
	switch mode {
	case ProviderProcess:
		return false, nil
	case ProviderContainers, ProviderAuto, "":
	default:
		return false, fmt.Errorf("%s=%q: want %s, %s or %s", EnvTestbed, mode, ProviderProcess, ProviderContainers, ProviderAuto)
	}
	d := decide(kind)
	d.once.Do(func() { d.ok, d.err = engineHas(Image(kind)) })
	if mode == ProviderContainers {
		return true, d.err
	}
	return d.err == nil && d.ok, nil
}

type decision struct {
	once sync.Once
	ok   bool
	err  error
}

var (
	decisionsMu sync.Mutex
	decisions   = map[string]*decision{}
)

func decide(kind string) *decision {
	decisionsMu.Lock()
	defer decisionsMu.Unlock()
	img := Image(kind) // the Redis image serves Sentinel too: one pull
	if decisions[img] == nil {
		decisions[img] = &decision{}
	}
	return decisions[img]
}

// engineHas reports whether the engine answers and holds img, pulling it
// when missing.
func engineHas(img string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cli, err := dockerClient(ctx)
	if err != nil {
		return false, err
	}
	defer cli.Close()
	if _, err := cli.ImageInspect(ctx, img); err == nil {
		return true, nil
	}
	rc, err := cli.ImagePull(ctx, img, image.PullOptions{})
	if err != nil {
		return false, fmt.Errorf("testbed: image %s: not on the engine and pull failed: %w", img, err)
	}
	defer rc.Close()
	io.Copy(io.Discard, rc) // the pull goes on until its progress stream ends
	if _, err := cli.ImageInspect(ctx, img); err != nil {
		return false, fmt.Errorf("testbed: image %s: pull: %w", img, err)
	}
	return true, nil
}

var (
	engineOnce sync.Once
	engineErr  error
)

// dockerClient connects to DOCKER_HOST or the default socket. The first
// call also turns Ryuk off (unless configured), starts the reaper and
// removes containers of dead sessions.
func dockerClient(ctx context.Context) (*testcontainers.DockerClient, error) {
	engineOnce.Do(func() {
		if _, set := os.LookupEnv("TESTCONTAINERS_RYUK_DISABLED"); !set {
			os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
		}
		tclog.SetDefault(quietLogger{}) // its banner would fill every test log
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cli, err := firstClient(pctx)
		if err == nil {
			_, err = cli.Ping(pctx)
			if err == nil {
				removeStale(pctx, cli)
			}
			cli.Close()
		}
		if err != nil {
			engineErr = fmt.Errorf("testbed: no container engine (DOCKER_HOST=%q): %w", os.Getenv("DOCKER_HOST"), err)
			return
		}
		engineErr = startReaper()
	})
	if engineErr != nil {
		return nil, engineErr
	}
	return testcontainers.NewDockerClientWithOpts(ctx)
}

// firstClient is the first connection: testcontainers panics when it finds
// no engine at all, which for auto only means processes.
func firstClient(ctx context.Context) (cli *testcontainers.DockerClient, err error) {
	_, statErr := os.Stat("/var/run/docker.sock")
	if os.Getenv("DOCKER_HOST") == "" && statErr != nil {
		if _, err := os.Stat(os.ExpandEnv("$HOME/.testcontainers.properties")); err != nil {
			return nil, errors.New("DOCKER_HOST is not set and /var/run/docker.sock is missing")
		}
	}
	defer func() {
		if p := recover(); p != nil {
			cli, err = nil, fmt.Errorf("%v", p)
		}
	}()
	return testcontainers.NewDockerClientWithOpts(ctx)
}

// ctr is the container behind a Server.
type ctr struct {
	c *testcontainers.DockerContainer
}

// ctrSpec is what a kind's container runs: the command given to the image's
// entrypoint, its environment, and files copied in before it starts.
type ctrSpec struct {
	cmd   []string
	env   map[string]string
	files map[string]string // container path -> content
}

// runContainer creates and starts the container for s on s.ports and waits
// until it serves. Callers hold s.mu or own s.
func (s *Server) runContainer(ctx context.Context) error {
	if _, err := dockerClient(ctx); err != nil {
		return err
	}
	cs := s.spec.ctr(s)
	env := map[string]string{}
	for k, v := range cs.env {
		env[k] = v
	}
	for _, kv := range s.opts.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	labels := map[string]string{labelTestbed: s.Kind}
	if s.opts.Detach {
		labels[labelKeep] = "1"
	} else {
		labels[labelSession] = session
	}
	var files []testcontainers.ContainerFile
	for path, content := range cs.files {
		files = append(files, testcontainers.ContainerFile{Reader: strings.NewReader(content), ContainerFilePath: path, FileMode: 0o644})
	}
	req := testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:  Image(s.Kind),
			Cmd:    cs.cmd,
			Env:    env,
			Labels: labels,
			Files:  files,
			HostConfigModifier: func(hc *container.HostConfig) {
				hc.NetworkMode = "host"
			},
			WaitingFor: readyStrategy{s},
		},
		Started: true,
	}
	ctx, cancel := context.WithTimeout(ctx, containerStartTimeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, req)
	if err != nil {
		tail := ""
		if dc, ok := c.(*testcontainers.DockerContainer); ok && dc != nil {
			tail = containerLogTail(dc)
			rmctx, rmcancel := context.WithTimeout(context.Background(), stopTimeout)
			dc.Terminate(rmctx)
			rmcancel()
		}
		if strings.Contains(strings.ToLower(tail), "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return fmt.Errorf("container %s: %w; log tail:\n%s", Image(s.Kind), err, tail)
	}
	s.ctr = &ctr{c: c.(*testcontainers.DockerContainer)}
	return nil
}

// readyStrategy is the process provider's readiness check as a wait
// strategy: the server answers its own protocol (SELECT 1, PING, srvr with
// a mode, etcd /health), and the container has not exited meanwhile.
type readyStrategy struct{ s *Server }

func (r readyStrategy) WaitUntilReady(ctx context.Context, t wait.StrategyTarget) error {
	var last error
	for delay := 20 * time.Millisecond; ; delay = min(delay*2, 250*time.Millisecond) {
		st, err := t.State(ctx)
		if err != nil {
			return err
		}
		if !st.Running {
			return fmt.Errorf("%s exited before ready (status %s, code %d)", r.s.Kind, st.Status, st.ExitCode)
		}
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		last = r.s.spec.ready(pctx, r.s)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %v)", r.s.Kind, ctx.Err(), last)
		case <-time.After(delay):
		}
	}
}

func (r readyStrategy) String() string { return r.s.Kind + " answers its protocol" }

// containerLogTail is the end of the container's output, for errors.
func containerLogTail(c *testcontainers.DockerContainer) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return ""
	}
	defer cli.Close()
	rc, err := cli.ContainerLogs(ctx, c.GetContainerID(), container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "40"})
	if err != nil {
		return ""
	}
	defer rc.Close()
	var out bytes.Buffer
	stdcopy.StdCopy(&out, &out, rc)
	return tailString(out.String(), 30)
}

// The Server methods for containers; callers hold s.mu.

func (s *Server) ctrRunning() bool {
	st, err := s.ctrState()
	return err == nil && st.Running
}

func (s *Server) ctrState() (*container.State, error) {
	if s.removed {
		return nil, errors.New("removed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.ctr.c.State(ctx)
}

func (s *Server) ctrPid() int {
	st, err := s.ctrState()
	if err != nil || !st.Running {
		return 0
	}
	return st.Pid
}

// ctrStop stops the container (unpausing it first) and removes it, unless
// Dir was given: then it stays, stopped, for a Restart.
func (s *Server) ctrStop() error {
	if s.removed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout+10*time.Second)
	defer cancel()
	s.ctrDo(ctx, func(cli *testcontainers.DockerClient, id string) error { return cli.ContainerUnpause(ctx, id) })
	timeout := stopTimeout
	var err error
	if s.ownDir {
		s.removed = true
		err = s.ctr.c.Terminate(ctx, testcontainers.StopTimeout(timeout))
		if rerr := os.RemoveAll(s.Dir); rerr != nil && err == nil {
			err = rerr
		}
	} else {
		err = s.ctr.c.Stop(ctx, &timeout)
	}
	if err != nil {
		return fmt.Errorf("stop %s %s: %w", s.Kind, s.Addr, err)
	}
	return nil
}

// ctrKill sends SIGKILL and waits until the container has stopped.
func (s *Server) ctrKill() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := s.ctrDo(ctx, func(cli *testcontainers.DockerClient, id string) error {
		if err := cli.ContainerKill(ctx, id, "KILL"); err != nil {
			return err
		}
		okc, errc := cli.ContainerWait(ctx, id, container.WaitConditionNotRunning)
		select {
		case <-okc:
			return nil
		case err := <-errc:
			return err
		}
	})
	if err != nil {
		return fmt.Errorf("kill %s: %w", s.Kind, err)
	}
	return nil
}

// ctrRestart starts the stopped container again: same ports and
// filesystem, and waits until it serves.
func (s *Server) ctrRestart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, containerStartTimeout)
	defer cancel()
	return s.ctr.c.Start(ctx)
}

// ctrPause freezes every process of the container (cgroup freezer), the
// container's SIGSTOP; ctrResume thaws them.
func (s *Server) ctrPause(pause bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.ctrDo(ctx, func(cli *testcontainers.DockerClient, id string) error {
		if pause {
			return cli.ContainerPause(ctx, id)
		}
		return cli.ContainerUnpause(ctx, id)
	})
}

func (s *Server) ctrDo(ctx context.Context, f func(*testcontainers.DockerClient, string) error) error {
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	return f(cli, s.ctr.c.GetContainerID())
}

// quietLogger drops testcontainers' progress lines; errors come back as
// errors with the container's log tail.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}
