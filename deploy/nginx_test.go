package deploy_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// directive is one nginx directive: its name, its arguments, and its block
// when it has one ("upstream orderd { ... }").
type directive struct {
	name  string
	args  []string
	block []directive
}

// parseNginx parses the subset of nginx's syntax deploy/nginx uses: words,
// quoted strings, comments, ';' and blocks. nginx itself checks the rest.
func parseNginx(src string) ([]directive, error) {
	tokens, err := tokenizeNginx(src)
	if err != nil {
		return nil, err
	}
	dirs, rest, err := parseBlock(tokens)
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("unexpected %q", rest[0])
	}
	return dirs, nil
}

func parseBlock(tokens []string) (dirs []directive, rest []string, err error) {
	var words []string
	for len(tokens) > 0 {
		tok := tokens[0]
		tokens = tokens[1:]
		switch tok {
		case ";":
			if len(words) == 0 {
				return nil, nil, fmt.Errorf("empty directive")
			}
			dirs = append(dirs, directive{name: words[0], args: words[1:]})
			words = nil
		case "{":
			if len(words) == 0 {
				return nil, nil, fmt.Errorf("block without a name")
			}
			inner, after, err := parseBlock(tokens)
			if err != nil {
				return nil, nil, err
			}
			if len(after) == 0 || after[0] != "}" {
				return nil, nil, fmt.Errorf("block %q not closed", words[0])
			}
			dirs = append(dirs, directive{name: words[0], args: words[1:], block: inner})
			tokens, words = after[1:], nil
		case "}":
			if len(words) > 0 {
				return nil, nil, fmt.Errorf("directive %q has no ';'", words[0])
			}
			return dirs, append([]string{"}"}, tokens...), nil
		default:
			words = append(words, tok)
		}
	}
	if len(words) > 0 {
		return nil, nil, fmt.Errorf("directive %q has no ';'", words[0])
	}
	return dirs, nil, nil
}

func tokenizeNginx(src string) ([]string, error) {
	var tokens []string
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == ';' || c == '{' || c == '}':
			tokens = append(tokens, string(c))
			i++
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unterminated string")
			}
			tokens = append(tokens, src[i+1:j])
			i = j + 1
		default:
			j := i
			for j < len(src) && !strings.ContainsRune(" \t\r\n;{}", rune(src[j])) {
				j++
			}
			tokens = append(tokens, src[i:j])
			i = j
		}
	}
	return tokens, nil
}

// walk calls fn for every directive, blocks included, depth first.
func walk(dirs []directive, fn func(directive)) {
	for _, d := range dirs {
		fn(d)
		walk(d.block, fn)
	}
}

// checkNginxUpstream: the upstream that requests are proxied to lists exactly
// the replicas, at their listen port, none marked down or backup.
func checkNginxUpstream(src string, replicas []string, port string) []string {
	dirs, err := parseNginx(src)
	if err != nil {
		return []string{"nginx.conf: " + err.Error()}
	}
	upstreams := map[string][]directive{}
	var proxied []string
	walk(dirs, func(d directive) {
		switch {
		case d.name == "upstream" && len(d.args) == 1:
			upstreams[d.args[0]] = d.block
		case d.name == "proxy_pass" && len(d.args) == 1:
			proxied = append(proxied, strings.TrimPrefix(d.args[0], "http://"))
		}
	})
	if len(proxied) == 0 {
		return []string{"nginx.conf: no proxy_pass"}
	}
	var problems []string
	for _, name := range proxied {
		block, ok := upstreams[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("nginx.conf: proxy_pass to %q, which is no upstream", name))
			continue
		}
		var listed []string
		for _, d := range block {
			if d.name != "server" || len(d.args) == 0 {
				continue
			}
			listed = append(listed, d.args[0])
			host, _, _ := net.SplitHostPort(d.args[0])
			if !slices.Contains(replicas, host) {
				problems = append(problems, fmt.Sprintf("nginx.conf: upstream %s lists %s, which is not a replica", name, d.args[0]))
			}
			for _, flag := range d.args[1:] {
				if flag == "down" || flag == "backup" {
					problems = append(problems, fmt.Sprintf("nginx.conf: upstream %s marks %s %s: round-robin must reach every replica", name, d.args[0], flag))
				}
			}
		}
		for _, r := range replicas {
			if want := net.JoinHostPort(r, port); !slices.Contains(listed, want) {
				problems = append(problems, fmt.Sprintf("nginx.conf: upstream %s does not list replica %s (server %s)", name, r, want))
			}
		}
	}
	return problems
}

// TestNginxAcceptsConfig runs nginx's own check, `nginx -t`, on the config.
// The replicas' names only resolve inside compose, and nginx -t resolves
// upstream names and binds the listen ports: so it checks a copy whose
// upstream servers are 127.0.0.1 and whose listen ports are free ones, with
// the pid file and error log in a temp dir. Nothing else is changed.
func TestNginxAcceptsConfig(t *testing.T) {
	nginx := findNginx(t)
	conf := readFile(t, "nginx/nginx.conf")

	t.Run("deploy config", func(t *testing.T) {
		if out, err := nginxTest(t, nginx, localCopy(t, conf)); err != nil {
			t.Fatalf("nginx -t refused deploy/nginx/nginx.conf: %v\n%s", err, out)
		}
	})
	// The check can fail: a copy missing one ';' is refused.
	t.Run("broken copy refused", func(t *testing.T) {
		broken := mustReplace(t, conf, "keepalive 32;", "keepalive 32")
		if out, err := nginxTest(t, nginx, localCopy(t, broken)); err == nil {
			t.Fatalf("nginx -t accepted a config missing a ';':\n%s", out)
		}
	})
}

var (
	upstreamServer = regexp.MustCompile(`(?m)^(\s*server\s+)[A-Za-z0-9.-]+:(\d+)`)
	listenLine     = regexp.MustCompile(`(?m)^(\s*listen\s+)[^;]+;`)
)

// localCopy rewrites the upstream servers to 127.0.0.1 and each listen to
// a free loopback port.
func localCopy(t *testing.T, conf string) string {
	t.Helper()
	conf = upstreamServer.ReplaceAllString(conf, "${1}127.0.0.1:${2}")
	return listenLine.ReplaceAllStringFunc(conf, func(line string) string {
		m := listenLine.FindStringSubmatch(line)
		return m[1] + "127.0.0.1:" + strconv.Itoa(freePort(t)) + ";"
	})
}

func nginxTest(t *testing.T, nginx, conf string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "nginx.conf")
	writeFile(t, path, conf)
	cmd := exec.CommandContext(t.Context(), nginx, "-t",
		"-p", dir+"/",
		"-c", path,
		"-e", filepath.Join(dir, "error.log"),
		"-g", "pid "+filepath.Join(dir, "nginx.pid")+";")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// findNginx returns the nginx binary, or skips (fails under
// OVERSOLD_REQUIRE_SERVERS=1) with the command that installs it.
func findNginx(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("nginx"); err == nil {
		return path
	}
	// Debian puts it in /usr/sbin, often not on a non-root PATH.
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	const msg = "nginx not found: install it with `apt-get install -y nginx`"
	if os.Getenv("OVERSOLD_REQUIRE_SERVERS") == "1" {
		t.Fatal(msg + " (OVERSOLD_REQUIRE_SERVERS=1)")
	}
	t.Skip(msg)
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
