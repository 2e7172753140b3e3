package loadtest

import (
	"strconv"
	"strings"
)

// PeakRSS reads each running replica's peak resident set size (VmHWM in
// /proc/<pid>/status, Linux only) in MiB, and returns the largest and all of
// them by replica name. Read it before Stop: a stopped process has none. A
// replica whose figure cannot be read is left out.
func (f *Fleet) PeakRSS() (peak float64, byReplica map[string]float64) {
	for _, r := range f.Replicas {
		pid := r.Pid()
		if pid == 0 {
			continue
		}
		kib, ok := statusKiB(readFile("/proc/"+strconv.Itoa(pid)+"/status"), "VmHWM")
		if !ok {
			continue
		}
		mib := round(float64(kib) / 1024)
		if byReplica == nil {
			byReplica = map[string]float64{}
		}
		byReplica[r.Name] = mib
		peak = max(peak, mib)
	}
	return peak, byReplica
}

// statusKiB reads a "Key:   1234 kB" line of a /proc status file.
func statusKiB(status, key string) (int64, bool) {
	for line := range strings.Lines(status) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		return n, err == nil
	}
	return 0, false
}
