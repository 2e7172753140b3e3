package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake orderd: started with fakeReplicaEnv=1
// it serves /readyz on OVERSOLD_ADDR until SIGTERM, or, with
// fakeReplicaEnv=fail, exits 2 naming a bad setting as orderd does.
const fakeReplicaEnv = "OVERSOLD_LAB_FAKE_REPLICA"

func init() {
	switch os.Getenv(fakeReplicaEnv) {
	case "1":
		fakeReplica()
	case "fail":
		fmt.Fprintln(os.Stderr, `orderd: OVERSOLD_LOCK: unknown lock backend "paxos"`)
		os.Exit(2)
	}
}

func fakeReplica() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	name := os.Getenv("OVERSOLD_INSTANCE")
	srv := &http.Server{Addr: os.Getenv("OVERSOLD_ADDR"), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s lock=%s", name, os.Getenv("OVERSOLD_LOCK"))
	})}
	go func() {
		<-ctx.Done()
		srv.Shutdown(context.Background())
	}()
	fmt.Fprintf(os.Stderr, "fake replica %s listening on %s, guard %q\n", name, srv.Addr, os.Getenv("OVERSOLD_GUARD"))
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "fake replica %s stopped\n", name)
	os.Exit(0)
}

func fakeFleet(t *testing.T, mode string, n int) (*Fleet, FleetConfig, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := FleetConfig{
		Binary:   exe,
		Replicas: n,
		Env:      map[string]string{fakeReplicaEnv: mode, "OVERSOLD_LOCK": "redis"},
		LogDir:   t.TempDir(),
		Ready:    10 * time.Second,
	}
	f, err := StartFleet(t.Context(), cfg)
	if f != nil {
		t.Cleanup(func() { f.Stop(context.Background()) })
	}
	return f, cfg, err
}

// get asks a replica for its name, or reports why it could not.
func get(url string) (string, error) {
	client := &http.Client{Timeout: 300 * time.Millisecond}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url + "/healthz")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	name, _, _ := strings.Cut(string(body), " ")
	return name, err
}

func TestFleetPauseResumeKillRestart(t *testing.T) {
	t.Setenv("OVERSOLD_GUARD", "leaked-from-the-shell") // must not reach replicas
	f, cfg, err := fakeFleet(t, "1", 3)
	if err != nil {
		t.Fatal(err)
	}
	urls := f.URLs()
	if len(urls) != 3 || urls[0] == urls[1] {
		t.Fatalf("urls %v", urls)
	}
	for i, u := range urls {
		if name, err := get(u); err != nil || name != fmt.Sprintf("r%d", i+1) {
			t.Errorf("replica %d answers %q, %v", i+1, name, err)
		}
	}

	r1, r2 := f.Replicas[0], f.Replicas[1]
	if err := r1.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(r1.URL); err == nil {
		t.Error("a paused replica answered")
	}
	if err := r1.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(r1.URL); err != nil {
		t.Errorf("a resumed replica does not answer: %v", err)
	}

	if err := r2.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(r2.URL); err == nil {
		t.Error("a killed replica answered")
	}
	if c := f.Crashed(); c != "" {
		t.Errorf("a replica killed on purpose counts as crashed: %s", c)
	}
	if err := r2.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if name, err := get(r2.URL); err != nil || name != "r2" {
		t.Errorf("restarted replica answers %q, %v on its old URL", name, err)
	}

	// A replica that dies by itself is a crash, named with its log.
	syscall.Kill(f.Replicas[2].Pid(), syscall.SIGKILL)
	<-f.Replicas[2].done()
	if c := f.Crashed(); !strings.Contains(c, "replica r3 exited") || !strings.Contains(c, "listening") {
		t.Errorf("crash report %q", c)
	}

	// A paused replica still stops: Stop resumes it before SIGTERM.
	r1.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := f.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
	for _, r := range f.Replicas {
		if _, err := get(r.URL); err == nil {
			t.Errorf("%s answers after Stop", r.Name)
		}
	}
	log, err := os.ReadFile(filepath.Join(cfg.LogDir, "r2.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "fake replica r2 listening"); n != 2 {
		t.Errorf("r2's log holds %d starts, want 2 (restart appends):\n%s", n, log)
	}
	if strings.Contains(string(log), "leaked") {
		t.Error("the shell's OVERSOLD_* reached a replica")
	}
}

func TestFleetStartFailureNamesTheSetting(t *testing.T) {
	_, _, err := fakeFleet(t, "fail", 2)
	if err == nil {
		t.Fatal("a fleet whose replicas exit at start started")
	}
	if !strings.Contains(err.Error(), "exited at start") || !strings.Contains(err.Error(), "OVERSOLD_LOCK") {
		t.Errorf("error %q does not quote the replica's reason", err)
	}
}

// Replicas of a fleet never share a port, even when the kernel hands the
// same free port out twice in a row.
func TestFleetPortsDistinct(t *testing.T) {
	ports := []int{40001, 40001, 40001, 40002, 40002, 40003}
	pickPort = func() (int, error) {
		p := ports[0]
		ports = ports[1:]
		return p, nil
	}
	t.Cleanup(func() { pickPort = freePort })
	f := &Fleet{}
	var got []string
	for range 3 {
		r, err := f.newReplica(nil)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.addr)
	}
	want := []string{"127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"}
	if !slices.Equal(got, want) {
		t.Errorf("replica addresses %v, want %v", got, want)
	}
}
