//go:build !linux

package testbed

import "syscall"

// sysProcAttr: without Pdeathsig, servers outlive a crashed parent here;
// Stop and Main still clean up.
func sysProcAttr(detach bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func listening(pid, port int) error { return nil }
