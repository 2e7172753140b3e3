//go:build !linux

package testbed

import (
	"errors"
	"syscall"
)

// sysProcAttr: without Pdeathsig, servers outlive a crashed parent here;
// Stop and Main still clean up.
func sysProcAttr(detach bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func listening(pid, port int) error { return nil }

// Connections needs /proc: not available here.
func Connections(addrs ...string) (int, error) {
	return 0, errors.New("testbed: Connections needs Linux /proc")
}
