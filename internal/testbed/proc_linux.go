package testbed

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr puts the child in its own process group, so a terminal's ^C
// reaches only us (we stop the servers), and unless detached kills it when
// we die, even by SIGKILL.
func sysProcAttr(detach bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if !detach {
		a.Pdeathsig = syscall.SIGKILL
	}
	return a
}

// listening returns nil when process pid holds a TCP socket listening on
// port: its socket inodes (/proc/pid/fd) against the listeners in
// /proc/net/tcp and tcp6 (a JVM listens on tcp6 even for 127.0.0.1).
// When /proc cannot tell, it does not block readiness.
func listening(pid, port int) error {
	inodes, err := socketInodes(pid)
	if err != nil {
		return nil
	}
	readable := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		readable = true
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" { // 0A = LISTEN
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			p, err := strconv.ParseUint(fs[1][i+1:], 16, 16)
			if err == nil && int(p) == port && inodes[fs[9]] {
				f.Close()
				return nil
			}
		}
		f.Close()
	}
	if !readable {
		return nil
	}
	return fmt.Errorf("pid %d not listening on port %d yet", pid, port)
}

// Connections counts this process' established TCP connections to the
// ports of addrs (host:port, any host): what its clients hold open to
// those servers.
func Connections(addrs ...string) (int, error) {
	ports := make(map[uint64]bool)
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return 0, err
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("testbed: port of %q: %w", a, err)
		}
		ports[p] = true
	}
	inodes, err := socketInodes(os.Getpid())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "01" || !inodes[fs[9]] { // 01 = ESTABLISHED
				continue
			}
			i := strings.LastIndexByte(fs[2], ':')
			if p, err := strconv.ParseUint(fs[2][i+1:], 16, 16); err == nil && ports[p] {
				n++
			}
		}
		f.Close()
	}
	return n, nil
}

// socketInodes returns the inodes of process pid's sockets.
func socketInodes(pid int) (map[string]bool, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := make(map[string]bool)
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	return inodes, nil
}
