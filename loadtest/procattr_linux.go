package loadtest

import "syscall"

// sysProcAttr makes the kernel kill a replica when the lab dies, so an
// interrupted or crashed lab leaves no orderd behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
