package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/testcontainers/testcontainers-go"
)

// session labels this process's containers: "<pid>-<random>".
var session = fmt.Sprintf("%d-%08x", os.Getpid(), rand.Uint32())

// envReaper makes this executable the reaper of the session it names.
const envReaper = "OVERSOLD_TESTBED_REAPER"

// The reaper is this same executable, started by startReaper with
// OVERSOLD_TESTBED_REAPER set: it never gets to main (or to the tests). It
// reads its stdin, a pipe whose other end only this process holds, so the
// read ends when this process dies, by a panic or SIGKILL too; then it
// removes the session's containers. Ryuk works the same way, over TCP.
func init() {
	if s := os.Getenv(envReaper); s != "" {
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		io.Copy(io.Discard, os.Stdin)
		removeSession(s)
		os.Exit(0)
	}
}

// reaperPipe is the write end the reaper watches; held until we exit.
var reaperPipe *os.File

func startReaper() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("testbed: reaper: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("testbed: reaper: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envReaper+"="+session)
	cmd.Stdin = r // an *os.File: no copying goroutine
	// Its own process group: a terminal's ^C must not end it before us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("testbed: reaper: %w", err)
	}
	r.Close()
	reaperPipe = w
	go waitReaper(cmd) // no zombie if it ever ends first
	return nil
}

// waitReaper is named for GoleakOptions.
func waitReaper(cmd *exec.Cmd) { cmd.Wait() }

// removeSession removes the containers of session s, with their volumes.
func removeSession(s string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	return removeWhere(ctx, cli, func(labels map[string]string) bool { return labels[labelSession] == s })
}

// removeStale removes containers of sessions whose process is gone (a
// machine reboot, or a reaper that was killed too).
func removeStale(ctx context.Context, cli *testcontainers.DockerClient) {
	removeWhere(ctx, cli, func(labels map[string]string) bool {
		s := labels[labelSession]
		pid, err := strconv.Atoi(strings.SplitN(s, "-", 2)[0])
		return s != "" && err == nil && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
}

func removeWhere(ctx context.Context, cli *testcontainers.DockerClient, match func(map[string]string) bool) error {
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", labelSession))})
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range list {
		if match(c.Labels) {
			errs = append(errs, cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}))
		}
	}
	return errors.Join(errs...)
}

// RemoveContainers removes every container this process started (except
// detached ones); Main calls it after the tests.
func RemoveContainers() error {
	// Once done, the once also keeps a later start from using the engine.
	engineOnce.Do(func() { engineErr = errors.New("testbed: containers removed at exit") })
	if reaperPipe == nil {
		return nil // no engine was ever used
	}
	return removeSession(session)
}
