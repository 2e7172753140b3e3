package locktest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking"
)

// Identity checks a backend's locking.Identifier on real servers that
// start starts with opts (which must keep the data across Kill and
// Restart), through Lockers that open makes on a server's address:
//   - Lockers on one server agree, even when all ask first at once (a
//     start barrier releases them together);
//   - the server killed and restarted with its data keeps it (no needless
//     new fence epoch);
//   - a fresh server gives another one (its tokens start again), also at
//     the address of one that had an identity.
//
// It returns the first server and its identity, for checks of the
// backend's own (a Redis that loses its data).
func Identity(t *testing.T, start func(context.Context, testbed.Options) (*testbed.Server, error), opts testbed.Options,
	open func(t *testing.T, addr string) locking.Locker) (*testbed.Server, string) {
	t.Helper()
	srv := privateServer(t, start, opts)
	const callers = 4
	ids := make([]string, callers)
	errs := make([]error, callers)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		l := open(t, srv.Addr)
		wg.Go(func() {
			<-gate
			ids[i], errs[i] = IdentityOf(t, l)
		})
	}
	close(gate)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	for i, got := range ids {
		if got == "" || got != id {
			t.Fatalf("identities of %d Lockers asking at once on one server: %q; want one, not empty (caller %d)", callers, ids, i)
		}
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, err := IdentityOf(t, open(t, srv.Addr)); err != nil || got != id {
		t.Errorf("identity after the server restarted with its data: %q, %v; want %q", got, err, id)
	}
	// A fresh server at the same address, as a new cluster under the same
	// endpoints is: an identity derived from the address would not change
	// (on another port, it would).
	gone := privateServer(t, start, testbed.Options{Args: opts.Args})
	goneID, err := IdentityOf(t, open(t, gone.Addr))
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(gone.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Kill(); err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	fresh := privateServer(t, start, testbed.Options{Args: opts.Args, Port: p})
	if got, err := IdentityOf(t, open(t, fresh.Addr)); err != nil || got == "" || got == goneID || got == id {
		t.Errorf("identity on a fresh server at %s, where one with identity %q ran: %q, %v; want a new one", fresh.Addr, goneID, got, err)
	}
	return srv, id
}

// IdentityOf is locking.IdentityOf on the test's context, failing when
// l has no identity.
func IdentityOf(t *testing.T, l locking.Locker) (string, error) {
	if _, ok := l.(locking.Identifier); !ok {
		return "", errors.New("the Locker has no Identity")
	}
	return locking.IdentityOf(t.Context(), l)
}
