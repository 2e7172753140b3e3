package loadtest

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Machine is what the figures were measured on: they mean little without it.
type Machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	OS     string `json:"os"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
}

// ThisMachine describes the machine the lab runs on, as far as it can tell.
func ThisMachine() Machine {
	m := Machine{
		CPU:    "unknown CPU",
		Cores:  runtime.NumCPU(),
		OS:     runtime.GOOS,
		Kernel: strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		Go:     runtime.Version(),
	}
	if v := field("/proc/cpuinfo", "model name", ':'); v != "" {
		m.CPU = v
	}
	if v := field("/etc/os-release", "PRETTY_NAME", '='); v != "" {
		m.OS = strings.Trim(v, `"`)
	}
	return m
}

func (m Machine) String() string {
	s := fmt.Sprintf("%s, %d cores, %s", m.CPU, m.Cores, m.OS)
	if m.Kernel != "" {
		s += " (Linux " + m.Kernel + ")"
	}
	return s + ", " + m.Go
}

// field returns the value of the first "key<sep>value" line of a file.
func field(path, key string, sep byte) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), string(sep))
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
