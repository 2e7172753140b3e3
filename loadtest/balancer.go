package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

// Balancer is a round-robin HTTP reverse proxy on a loopback port, the
// in-process stand-in for the nginx of the compose demo. Each request goes to
// the next replica in turn; a replica that does not answer costs that request
// a 502, as it would behind a real balancer without retries.
type Balancer struct {
	URL string // where clients send requests

	backends  []*url.URL
	next      atomic.Uint64
	server    *http.Server
	transport *http.Transport
	done      chan struct{}
}

// NewBalancer starts a balancer in front of replicas (base URLs). conns is
// how many idle connections it keeps to each replica: set it to the
// attack's worker count, so no request waits for a new connection.
func NewBalancer(replicas []string, conns int) (*Balancer, error) {
	if len(replicas) == 0 {
		return nil, errors.New("balancer: no replicas")
	}
	b := &Balancer{
		transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConns:        conns * len(replicas),
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     30 * time.Second,
		},
		done: make(chan struct{}),
	}
	for _, r := range replicas {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("balancer: replica %q: %w", r, err)
		}
		b.backends = append(b.backends, u)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("balancer: %w", err)
	}
	b.URL = "http://" + ln.Addr().String()
	b.server = &http.Server{
		Handler: &httputil.ReverseProxy{
			Rewrite:        b.rewrite,
			ModifyResponse: tagReplica,
			Transport:      b.transport,
			ErrorHandler:   badGateway,
		},
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() {
		defer close(b.done)
		_ = b.server.Serve(ln) // returns http.ErrServerClosed on Close
	}()
	return b, nil
}

// rewrite sends the request to the next replica in turn.
func (b *Balancer) rewrite(r *httputil.ProxyRequest) {
	n := b.next.Add(1) - 1
	r.SetURL(b.backends[n%uint64(len(b.backends))])
	r.SetXForwarded()
}

// ReplicaHeader names, in each answer through the balancer, the replica
// (host:port) that served it: the history check records it.
const ReplicaHeader = "X-Oversold-Replica"

func tagReplica(resp *http.Response) error {
	resp.Header.Set(ReplicaHeader, resp.Request.URL.Host)
	return nil
}

// badGateway answers in the API's error shape when a replica does not.
func badGateway(w http.ResponseWriter, _ *http.Request, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_, _ = fmt.Fprintf(w, `{"error":{"code":"bad_gateway","message":%q}}`, err.Error())
}

// Close stops accepting requests, waits up to ctx for those in flight, and
// drops the idle connections to the replicas.
func (b *Balancer) Close(ctx context.Context) error {
	err := b.server.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, b.server.Close())
	}
	<-b.done
	b.transport.CloseIdleConnections()
	return err
}
