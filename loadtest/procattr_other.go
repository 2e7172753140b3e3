//go:build !linux

package loadtest

import "syscall"

// sysProcAttr: outside Linux a replica outlives a lab that dies abruptly.
func sysProcAttr() *syscall.SysProcAttr { return nil }
