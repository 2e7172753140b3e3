// Package deploy_test checks the deployment files where no Docker engine and
// no cluster run: docker-compose.yml's wiring (this file), nginx's own
// `nginx -t` (nginx_test.go), the Kubernetes manifests against the official
// API types (k8s_test.go), and the Grafana dashboard (grafana_test.go).
//
// Each check is a function returning the problems it finds, so every test
// also runs it on deliberately broken copies and expects the break reported.
package deploy_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/go-sql-driver/mysql"
	"sigs.k8s.io/yaml"

	"github.com/oversold-lab/oversold/internal/designdoc"
)

// designVars is docs/design.md's orderd configuration table, read from the
// document: the only variables orderd accepts, so the only ones a deployment
// may give it. designLocks and designGuards are the values the table allows
// for OVERSOLD_LOCK and OVERSOLD_GUARD.
var designVars, designLocks, designGuards = readDesign()

func readDesign() (vars, locks, guards []string) {
	rows, err := designdoc.ConfigTable()
	if err != nil {
		panic(err)
	}
	for _, r := range rows {
		vars = append(vars, r.Variable)
		switch r.Variable {
		case "OVERSOLD_LOCK":
			locks = strings.Split(r.Meaning, ", ")
		case "OVERSOLD_GUARD":
			guards = strings.Split(r.Meaning, ", ")
		}
	}
	if len(locks) < 2 || len(guards) < 2 {
		panic(fmt.Sprintf("docs/design.md: no values listed for OVERSOLD_LOCK (%q) or OVERSOLD_GUARD (%q)", locks, guards))
	}
	return vars, locks, guards
}

// The routes of docs/design.md's HTTP API that probes use.
const (
	readyPath  = "/readyz"
	healthPath = "/healthz"
)

// serverVars name servers: each host in their values must be a service of
// the compose stack (or, in Kubernetes, of the cluster).
var serverVars = []string{
	"OVERSOLD_MYSQL_DSN",
	"OVERSOLD_REDIS_ADDR",
	"OVERSOLD_REDLOCK_ADDRS",
	"OVERSOLD_ZK_SERVERS",
	"OVERSOLD_ETCD_ENDPOINTS",
}

// Names in docker-compose.yml the checks rely on.
const (
	replicaPrefix = "orderd" // the replicas are orderd1, orderd2, ...
	balancer      = "nginx"
	labService    = "lab"
)

// The repository root, from this package's directory.
const repoRoot = ".."

// stackFiles is what the compose checks read; tests break copies of it.
type stackFiles struct {
	compose, env, nginx, prometheus string
}

func readStackFiles(t *testing.T) stackFiles {
	t.Helper()
	return stackFiles{
		compose:    readFile(t, filepath.Join(repoRoot, "docker-compose.yml")),
		env:        readFile(t, filepath.Join(repoRoot, ".env")),
		nginx:      readFile(t, "nginx/nginx.conf"),
		prometheus: readFile(t, "prometheus/prometheus.yml"),
	}
}

// loadCompose loads the stack the way `docker compose` does from dir: the
// compose file, interpolated from dir/.env, with every profile enabled so the
// lab is checked too. The shell's environment is left out on purpose: the
// test checks the files, not the developer's exported variables.
func loadCompose(t *testing.T, dir string) (*types.Project, error) {
	t.Helper()
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(dir, "docker-compose.yml")},
		cli.WithWorkingDirectory(dir),
		cli.WithEnvFiles(filepath.Join(dir, ".env")),
		cli.WithDotEnv,
		cli.WithProfiles([]string{"*"}),
	)
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(t.Context())
}

// checkStack returns every wiring problem of the loaded stack.
func checkStack(p *types.Project, f stackFiles) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	replicas := replicaNames(p)
	if len(replicas) < 2 {
		add("want at least 2 orderd replicas (services %s1, %s2, ...), found %v", replicaPrefix, replicaPrefix, replicas)
		return problems
	}

	// One configuration for all: the same environment except the instance
	// name, which is what tells replicas apart.
	firstEnv := environment(p.Services[replicas[0]])
	instances := map[string]string{}
	for _, name := range replicas {
		env := environment(p.Services[name])
		for key := range env {
			if !slices.Contains(designVars, key) {
				add("%s: variable %s is not in docs/design.md's configuration table", name, key)
			}
		}
		inst := env["OVERSOLD_INSTANCE"]
		if inst == "" {
			add("%s: OVERSOLD_INSTANCE is not set", name)
		} else if other, dup := instances[inst]; dup {
			add("%s and %s share OVERSOLD_INSTANCE=%q", other, name, inst)
		}
		instances[inst] = name
		for _, key := range union(env, firstEnv) {
			if key == "OVERSOLD_INSTANCE" {
				continue
			}
			if a, b := firstEnv[key], env[key]; a != b {
				add("%s=%q on %s but %q on %s: every replica must get the same settings", key, a, replicas[0], b, name)
			}
		}
	}
	env := firstEnv
	if lock := env["OVERSOLD_LOCK"]; !slices.Contains(designLocks, lock) {
		add("OVERSOLD_LOCK=%q is not one of %v", lock, designLocks)
	}
	if guard := env["OVERSOLD_GUARD"]; !slices.Contains(designGuards, guard) {
		add("OVERSOLD_GUARD=%q is not one of %v", guard, designGuards)
	}
	port, err := listenPort(env["OVERSOLD_ADDR"])
	if err != nil {
		add("%s: %v", replicas[0], err)
	}

	// Every server a replica (or the lab) is given is a service that starts
	// with the stack and has a healthcheck, and each replica waits for it.
	for _, name := range append(slices.Clone(replicas), labService) {
		svc, ok := p.Services[name]
		if !ok {
			continue // the lab's absence is reported below
		}
		for _, key := range serverVars {
			value, set := environment(svc)[key]
			if !set {
				if name != labService {
					add("%s: %s is not set", name, key)
				}
				continue
			}
			hosts, err := serverHosts(key, value)
			if err != nil {
				add("%s: %s: %v", name, key, err)
				continue
			}
			for _, host := range hosts {
				server, ok := p.Services[host]
				switch {
				case !ok:
					add("%s: %s names %q, which is not a service of the stack", name, key, host)
					continue
				case len(server.Profiles) > 0:
					add("%s: %s names %q, which only starts with profile %v", name, key, host, server.Profiles)
				}
				if !hasHealthcheck(server) {
					add("server %s has no healthcheck", host)
				}
				if name != labService && !waitsHealthy(svc, host) {
					add("%s: depends_on %s must have condition: service_healthy", name, host)
				}
			}
		}
	}
	if dsn := env["OVERSOLD_MYSQL_DSN"]; dsn != "" {
		problems = append(problems, checkDSNCredentials(p, dsn)...)
	}

	// The balancer starts after healthy replicas (it resolves their names at
	// start), and a replica is healthy only when /readyz says so.
	for _, name := range replicas {
		svc := p.Services[name]
		if !hasHealthcheck(svc) || !strings.Contains(strings.Join(svc.HealthCheck.Test, " "), readyPath) {
			add("%s: healthcheck must probe %s", name, readyPath)
		}
		if lb, ok := p.Services[balancer]; !ok {
			add("no %s service", balancer)
		} else if !waitsHealthy(lb, name) {
			add("%s: depends_on %s must have condition: service_healthy", balancer, name)
		}
	}
	if lb, ok := p.Services[balancer]; ok && !hasHealthcheck(lb) {
		add("%s has no healthcheck", balancer)
	}

	problems = append(problems, checkNginxUpstream(f.nginx, replicas, port)...)
	problems = append(problems, checkPrometheus(f.prometheus, replicas, port)...)
	problems = append(problems, checkLab(p)...)
	return problems
}

// checkDSNCredentials compares the DSN with the MySQL service's own settings:
// a wrong password or database only shows when orderd starts.
func checkDSNCredentials(p *types.Project, dsn string) []string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil // reported by serverHosts
	}
	host, _, _ := net.SplitHostPort(cfg.Addr)
	svc, ok := p.Services[host]
	if !ok {
		return nil
	}
	env := environment(svc)
	var problems []string
	wantUser, wantPass := env["MYSQL_USER"], env["MYSQL_PASSWORD"]
	if cfg.User == "root" {
		wantUser, wantPass = "root", env["MYSQL_ROOT_PASSWORD"]
	}
	if cfg.User != wantUser || cfg.Passwd != wantPass {
		problems = append(problems, fmt.Sprintf("OVERSOLD_MYSQL_DSN: user %q and its password do not match service %s's MYSQL_USER/MYSQL_PASSWORD", cfg.User, host))
	}
	if cfg.DBName != env["MYSQL_DATABASE"] {
		problems = append(problems, fmt.Sprintf("OVERSOLD_MYSQL_DSN: database %q is not service %s's MYSQL_DATABASE %q", cfg.DBName, host, env["MYSQL_DATABASE"]))
	}
	return problems
}

// checkLab: the lab runs only on request, after the balancer is healthy, and
// sends its orders through the balancer, not to one replica.
func checkLab(p *types.Project) []string {
	lab, ok := p.Services[labService]
	if !ok {
		return []string{"no " + labService + " service"}
	}
	var problems []string
	if !slices.Contains(lab.Profiles, labService) {
		problems = append(problems, fmt.Sprintf("%s must be under profiles: [%s], so `up` does not run it", labService, labService))
	}
	if !waitsHealthy(lab, balancer) {
		problems = append(problems, fmt.Sprintf("%s: depends_on %s must have condition: service_healthy", labService, balancer))
	}
	target := flagValue(lab.Command, "--target")
	u, err := url.Parse(target)
	if target == "" || err != nil || u.Hostname() != balancer {
		problems = append(problems, fmt.Sprintf("%s: --target=%q must be the balancer, http://%s:<port>", labService, target, balancer))
	}
	return problems
}

// checkPrometheus: every replica is a scrape target at its listen port.
func checkPrometheus(src string, replicas []string, port string) []string {
	var cfg struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(src), &cfg); err != nil {
		return []string{"prometheus.yml: " + err.Error()}
	}
	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	var problems []string
	for _, r := range replicas {
		if want := net.JoinHostPort(r, port); !slices.Contains(targets, want) {
			problems = append(problems, fmt.Sprintf("prometheus.yml does not scrape replica %s (target %s)", r, want))
		}
	}
	return problems
}

// serverHosts returns the hostnames in the value of one of serverVars, in the
// formats orderd accepts (deploy/k8s/README.md).
func serverHosts(key, value string) ([]string, error) {
	var addrs []string
	switch key {
	case "OVERSOLD_MYSQL_DSN":
		cfg, err := mysql.ParseDSN(value)
		if err != nil {
			return nil, err
		}
		if cfg.Net != "tcp" {
			return nil, fmt.Errorf("want a tcp(host:port) address, got %s", cfg.Net)
		}
		if !cfg.ParseTime {
			return nil, fmt.Errorf("the DSN must carry parseTime=true")
		}
		addrs = []string{cfg.Addr}
	case "OVERSOLD_REDIS_ADDR":
		// host:port, a Cluster's host:port list, or
		// sentinel://master@host:port,host:port.
		if rest, ok := strings.CutPrefix(value, "sentinel://"); ok {
			master, list, ok := strings.Cut(rest, "@")
			if !ok || master == "" {
				return nil, fmt.Errorf("%q: want sentinel://mastername@host:port,...", value)
			}
			value = list
		}
		addrs = strings.Split(value, ",")
	case "OVERSOLD_ETCD_ENDPOINTS":
		for _, ep := range strings.Split(value, ",") {
			if strings.Contains(ep, "://") {
				u, err := url.Parse(ep)
				if err != nil {
					return nil, err
				}
				if u.Scheme != "http" && u.Scheme != "https" {
					return nil, fmt.Errorf("%q: want http:// or https://", ep)
				}
				ep = u.Host
			}
			addrs = append(addrs, ep)
		}
	default:
		addrs = strings.Split(value, ",")
	}
	var hosts []string
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("%q: want host:port", a)
		}
		hosts = append(hosts, host)
	}
	return hosts, nil
}

// TestComposeWiring loads docker-compose.yml with .env as `docker compose`
// does and checks how the services fit together.
func TestComposeWiring(t *testing.T) {
	files := readStackFiles(t)
	p, err := loadCompose(t, repoRoot)
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	for _, problem := range checkStack(p, files) {
		t.Error(problem)
	}
	if t.Failed() {
		return
	}
	if env := environment(p.Services[replicaNames(p)[0]]); env["OVERSOLD_LOCK"] == "" || env["OVERSOLD_GUARD"] == "" {
		t.Errorf("OVERSOLD_LOCK and OVERSOLD_GUARD must come from .env, got %q and %q", env["OVERSOLD_LOCK"], env["OVERSOLD_GUARD"])
	}

	// Copies broken on purpose: each break must be reported.
	type edit struct{ file, old, new string }
	tests := []struct {
		name  string
		edits []edit
		want  string
	}{
		{
			name:  "one replica with another lock",
			edits: []edit{{"compose", "OVERSOLD_INSTANCE: orderd2\n", "OVERSOLD_INSTANCE: orderd2\n      OVERSOLD_LOCK: zookeeper\n"}},
			want:  `OVERSOLD_LOCK="redis" on orderd1 but "zookeeper" on orderd2`,
		},
		{
			name:  "one replica with another guard",
			edits: []edit{{"compose", "OVERSOLD_INSTANCE: orderd3\n", "OVERSOLD_INSTANCE: orderd3\n      OVERSOLD_GUARD: none\n"}},
			want:  `OVERSOLD_GUARD="version" on orderd1 but "none" on orderd3`,
		},
		{
			name:  "two replicas with one instance name",
			edits: []edit{{"compose", "OVERSOLD_INSTANCE: orderd3\n", "OVERSOLD_INSTANCE: orderd1\n"}},
			want:  `share OVERSOLD_INSTANCE="orderd1"`,
		},
		{
			name:  "lock unknown to docs/design.md",
			edits: []edit{{"env", "OVERSOLD_LOCK=redis", "OVERSOLD_LOCK=consul"}},
			want:  `OVERSOLD_LOCK="consul" is not one of`,
		},
		{
			name:  "variable outside the configuration table",
			edits: []edit{{"compose", `  OVERSOLD_LOCK_WAIT: "5s"`, "  OVERSOLD_LOCK_WAIT: \"5s\"\n  OVERSOLD_LOCK_TIMEOUT: \"5s\""}},
			want:  "variable OVERSOLD_LOCK_TIMEOUT is not in docs/design.md",
		},
		{
			name:  "address naming no service",
			edits: []edit{{"compose", "redlock3:6379", "redlock4:6379"}},
			want:  `names "redlock4", which is not a service`,
		},
		{
			name:  "DSN without parseTime",
			edits: []edit{{"compose", "/oversold?parseTime=true", "/oversold"}},
			want:  "parseTime=true",
		},
		{
			name:  "DSN with the wrong password",
			edits: []edit{{"compose", "oversold:oversold@tcp", "oversold:secret@tcp"}},
			want:  "do not match service mysql",
		},
		{
			name:  "server without healthcheck",
			edits: []edit{{"compose", `test: ["CMD", "zkServer.sh", "status"]`, "disable: true"}},
			want:  "server zookeeper has no healthcheck",
		},
		{
			name:  "replica not waiting for a healthy server",
			edits: []edit{{"compose", "etcd: {condition: service_healthy}", "etcd: {condition: service_started}"}},
			want:  "orderd1: depends_on etcd must have condition: service_healthy",
		},
		{
			name:  "balancer missing a replica",
			edits: []edit{{"nginx", "server orderd3:8080 max_fails=3 fail_timeout=5s;\n", ""}},
			want:  "does not list replica orderd3",
		},
		{
			name:  "balancer listing a stranger",
			edits: []edit{{"nginx", "server orderd3:8080", "server orderd3:8080;\n        server orderd9:8080"}},
			want:  "orderd9:8080, which is not a replica",
		},
		{
			name:  "prometheus missing a replica",
			edits: []edit{{"prometheus", "          - orderd2:8080\n", ""}},
			want:  "does not scrape replica orderd2",
		},
		{
			name:  "lab aimed at one replica",
			edits: []edit{{"compose", "--target=http://nginx:8080", "--target=http://orderd1:8080"}},
			want:  "must be the balancer",
		},
		{
			name:  "lab outside its profile",
			edits: []edit{{"compose", "profiles: [lab]", "profiles: []"}},
			want:  "must be under profiles: [lab]",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken := files
			for _, e := range tt.edits {
				switch e.file {
				case "compose":
					broken.compose = mustReplace(t, broken.compose, e.old, e.new)
				case "env":
					broken.env = mustReplace(t, broken.env, e.old, e.new)
				case "nginx":
					broken.nginx = mustReplace(t, broken.nginx, e.old, e.new)
				case "prometheus":
					broken.prometheus = mustReplace(t, broken.prometheus, e.old, e.new)
				}
			}
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "docker-compose.yml"), broken.compose)
			writeFile(t, filepath.Join(dir, ".env"), broken.env)
			p, err := loadCompose(t, dir)
			if err != nil {
				t.Fatalf("load broken copy: %v", err)
			}
			problems := checkStack(p, broken)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, tt.want) }) {
				t.Errorf("want a problem containing %q, got:\n%s", tt.want, strings.Join(problems, "\n"))
			}
		})
	}
}

// TestComposeRefusesBadFiles: what compose itself refuses, so does the test's
// loader: a stack without a chosen backend, and keys outside the compose
// schema.
func TestComposeRefusesBadFiles(t *testing.T) {
	compose := readFile(t, filepath.Join(repoRoot, "docker-compose.yml"))
	env := readFile(t, filepath.Join(repoRoot, ".env"))
	tests := []struct {
		name, compose, env, want string
	}{
		{"no backend chosen", compose, "# nothing chosen\n", "set OVERSOLD_LOCK in .env"},
		{"misspelt key", mustReplace(t, compose, "  stop_grace_period: 70s", "  stop_grace_periods: 70s"), env, "stop_grace_periods"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "docker-compose.yml"), tt.compose)
			writeFile(t, filepath.Join(dir, ".env"), tt.env)
			if _, err := loadCompose(t, dir); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want an error containing %q, got %v", tt.want, err)
			}
		})
	}
}

// TestDockerfile: the image compose builds exists and agrees with the
// manifests: a numeric non-root user (runAsNonRoot can only verify a number),
// the port orderd listens on, both binaries, static.
func TestDockerfile(t *testing.T) {
	p, err := loadCompose(t, repoRoot)
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	for _, name := range append(replicaNames(p), labService) {
		b := p.Services[name].Build
		if b == nil {
			t.Errorf("%s: no build section", name)
			continue
		}
		if got := filepath.Join(b.Context, b.Dockerfile); got != filepath.Join(absRepoRoot(t), "deploy", "Dockerfile") {
			t.Errorf("%s builds %s, want deploy/Dockerfile", name, got)
		}
	}

	df := readFile(t, "Dockerfile")
	stages := strings.Split(df, "\nFROM ")
	runtime := stages[len(stages)-1]
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/orderd", "./cmd/lab", "--mount=type=cache"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
	for _, want := range []string{"\nUSER 10001:10001\n", "\nEXPOSE 8080\n", "\nHEALTHCHECK ", healthPath} {
		if !strings.Contains(runtime, want) {
			t.Errorf("Dockerfile runtime stage: no %q", strings.TrimSpace(want))
		}
	}
}

// replicaNames returns the orderd replicas, sorted: orderd1, orderd2, ...
func replicaNames(p *types.Project) []string {
	var names []string
	for name := range p.Services {
		if n, ok := strings.CutPrefix(name, replicaPrefix); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func environment(svc types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range svc.Environment {
		if v != nil {
			env[k] = *v
		} else {
			env[k] = ""
		}
	}
	return env
}

func union(a, b map[string]string) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func hasHealthcheck(svc types.ServiceConfig) bool {
	hc := svc.HealthCheck
	return hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE"
}

func waitsHealthy(svc types.ServiceConfig, on string) bool {
	dep, ok := svc.DependsOn[on]
	return ok && dep.Condition == types.ServiceConditionHealthy
}

// listenPort returns the port of an OVERSOLD_ADDR value such as ":8080".
func listenPort(addr string) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", fmt.Errorf("OVERSOLD_ADDR=%q: want [host]:port", addr)
	}
	return port, nil
}

// flagValue returns the value of --name=value or --name value in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func absRepoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mustReplace replaces old in s, and fails when old is absent: a break that
// silently does not happen would make its test pass for nothing.
func mustReplace(t *testing.T, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("break not applied: %q not found", old)
	}
	return strings.Replace(s, old, new, 1)
}
