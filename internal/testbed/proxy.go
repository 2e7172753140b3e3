package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is an in-process toxiproxy TCP proxy on a free loopback port: the
// way to make one path to a server slow or dead while the other paths keep
// working (etcd's robustness tests use an in-process proxy the same way).
// It lives in this process: it ends with it.
type Proxy struct {
	p    *toxiproxy.Proxy
	mu   sync.Mutex
	on   []string      // toxics in place, by name
	slow chan struct{} // closed when a removal Restore stopped waiting for ends
}

// StartProxy listens on 127.0.0.1 and forwards every connection to upstream
// (host:port), which need not listen yet.
func StartProxy(name, upstream string) (*Proxy, error) {
	return startProxy(name, "127.0.0.1:0", upstream)
}

func startProxy(name, listen, upstream string) (*Proxy, error) {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, listen, upstream)
	if err := p.Start(); err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("proxy %s to %s: %w", name, upstream, err)
	}
	return &Proxy{p: p}, nil
}

// Addr is where clients connect instead of the upstream.
func (p *Proxy) Addr() string { return p.p.Listen }

// toxic adds a toxic ("latency", "timeout", ...) to one direction: stream
// "upstream" is client to server, "downstream" server to client. It applies
// to the connections already open as well as to new ones.
func (p *Proxy) toxic(name, typ, stream string, attrs map[string]int64) error {
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err != nil {
		return err
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("proxy %s: toxic %s: %w", p.p.Name, name, err)
	}
	p.mu.Lock()
	p.on = append(p.on, name)
	p.mu.Unlock()
	return nil
}

// Latency delays every chunk in both directions by d: a request and its
// reply each take d longer.
func (p *Proxy) Latency(d time.Duration) error {
	for _, s := range []string{"upstream", "downstream"} {
		if err := p.toxic("latency_"+s, "latency", s, map[string]int64{"latency": d.Milliseconds()}); err != nil {
			return err
		}
	}
	return nil
}

// Cut drops everything in both directions and closes nothing: a partition
// as the client sees it (connections still open, sends vanish, nothing
// comes back, until its own timeouts give up).
func (p *Proxy) Cut() error {
	for _, s := range []string{"upstream", "downstream"} {
		if err := p.toxic("timeout_"+s, "timeout", s, map[string]int64{"timeout": 0}); err != nil {
			return err
		}
	}
	return nil
}

// Refuse stops listening and closes the open connections: clients of Addr
// are refused, as by a server that is down. It is for good: Close is all
// that is left to do.
func (p *Proxy) Refuse() { p.p.Stop() }

// Restore removes every toxic: delayed data flows at once, dropped data
// stays dropped (the client has given up on those connections by then).
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	on := p.on
	p.on = nil
	for _, name := range on {
		// toxiproxy v2.5.0 can deadlock here: RemoveToxic waits for the
		// links while holding the collection's lock, which a link closing
		// at the same moment needs (seen once in ~70 zookeeper
		// slow-lock-server runs); on a loaded machine a removal also takes
		// seconds (it flushes what the toxic held, each chunk given 5 s).
		// Never let that hang the caller: stop waiting after a while, and
		// let Close wait longer for that removal.
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = p.p.Toxics.RemoveToxic(context.Background(), name)
		}()
		select {
		case <-done:
		case <-time.After(restoreTimeout):
			p.slow = done
			return
		}
	}
}

// Bounds on the removal of one toxic: Restore waits restoreTimeout for it,
// Close closeTimeout more.
const (
	restoreTimeout = 5 * time.Second
	closeTimeout   = 30 * time.Second
)

// Close restores and stops the proxy, closing its connections. A proxy
// whose toxic removal is still stuck after closeTimeout is left as it is:
// stopping it could block as well.
func (p *Proxy) Close() {
	p.Restore()
	p.mu.Lock()
	slow := p.slow
	p.mu.Unlock()
	if slow != nil {
		select {
		case <-slow:
		case <-time.After(closeTimeout):
			return
		}
	}
	p.p.Stop()
}

// Proxies is a group of proxies that fail together.
type Proxies []*Proxy

// Latency delays every proxy of the group (Proxy.Latency).
func (ps Proxies) Latency(d time.Duration) error {
	for _, p := range ps {
		if err := p.Latency(d); err != nil {
			return err
		}
	}
	return nil
}

// Cut cuts every proxy of the group (Proxy.Cut).
func (ps Proxies) Cut() error {
	for _, p := range ps {
		if err := p.Cut(); err != nil {
			return err
		}
	}
	return nil
}

// Restore restores every proxy of the group (Proxy.Restore).
func (ps Proxies) Restore() {
	for _, p := range ps {
		p.Restore()
	}
}

// Close closes every proxy of the group (Proxy.Close).
func (ps Proxies) Close() {
	for _, p := range ps {
		p.Close()
	}
}
