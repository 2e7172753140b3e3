package testbed

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/errdefs"
)

// needContainers skips unless OVERSOLD_TESTBED=containers.
func needContainers(t *testing.T) {
	t.Helper()
	if os.Getenv(EnvTestbed) != ProviderContainers {
		t.Skipf("%s=%s is needed", EnvTestbed, ProviderContainers)
	}
}

func TestBadProviderSetting(t *testing.T) {
	t.Setenv(EnvTestbed, "vm")
	_, err := StartRedis(t.Context(), Options{})
	if err == nil || !strings.Contains(err.Error(), EnvTestbed+`="vm"`) {
		t.Fatalf("start with %s=vm: %v, want an error naming the setting", EnvTestbed, err)
	}
}

func TestImageOverride(t *testing.T) {
	t.Setenv("OVERSOLD_IMAGE_ZOOKEEPER", "")
	if got := Image(KindZooKeeper); got != "zookeeper:3.9" {
		t.Errorf("Image(zookeeper) = %s, want the official zookeeper:3.9", got)
	}
	t.Setenv("OVERSOLD_IMAGE_ZOOKEEPER", "local/zk:1")
	if got := Image(KindZooKeeper); got != "local/zk:1" {
		t.Errorf("Image(zookeeper) = %s, want local/zk:1 from OVERSOLD_IMAGE_ZOOKEEPER", got)
	}
}

// Every kind runs as a container of its image, on the host's network, and
// the helpers' servers are those containers.
func TestContainersRunTheirImages(t *testing.T) {
	needContainers(t)
	MySQL(t)
	Redis(t)
	ZooKeeper(t)
	Etcd(t)
	master, err := StartRedis(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	sentinel, err := StartSentinel(t.Context(), "m", master.Addr, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sentinel.Stop()

	cli, err := dockerClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.ContainerList(t.Context(), container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", labelSession+"="+session))})
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]map[string]bool{} // kind -> images
	for _, c := range list {
		kind := c.Labels[labelTestbed]
		if images[kind] == nil {
			images[kind] = map[string]bool{}
		}
		images[kind][c.Image] = true
		if c.HostConfig.NetworkMode != "host" {
			t.Errorf("%s container %s: network %s, want host", kind, c.ID[:12], c.HostConfig.NetworkMode)
		}
	}
	for _, kind := range []string{KindMariaDB, KindRedis, KindSentinel, KindZooKeeper, KindEtcd} {
		if !images[kind][Image(kind)] {
			t.Errorf("no running %s container of %s; running: %v", kind, Image(kind), images)
		}
	}
}

// A test binary that panics leaves no container behind: the reaper removes
// them once it is gone.
func TestReaperRemovesContainersAfterPanic(t *testing.T) {
	needContainers(t)
	if os.Getenv("OVERSOLD_TESTBED_PANIC") == "1" {
		s, err := StartRedis(t.Context(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("container=" + s.ctr.c.GetContainerID() + "\n")
		panic("a test panics with a server running")
	}
	// The client first: its first use removes containers of dead sessions,
	// which must not be what removes the child's.
	cli, err := dockerClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestReaperRemovesContainersAfterPanic$", "-test.v")
	cmd.Env = append(os.Environ(), "OVERSOLD_TESTBED_PANIC=1")
	out, err := cmd.CombinedOutput()
	m := regexp.MustCompile(`container=(\w+)`).FindSubmatch(out)
	if err == nil || m == nil {
		t.Fatalf("child: %v, want a panic after starting a container; output:\n%s", err, out)
	}
	id := string(m[1])
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := cli.ContainerInspect(t.Context(), id)
		if errdefs.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still there 30s after its test binary panicked (inspect: %v)", id[:12], err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
