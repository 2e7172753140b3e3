package order

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/oversold-lab/oversold/storage"
)

// TestClassifyRequestTime: a request whose own time ran out, or whose client
// left, is a 503 the client can act on, not a failure nobody anticipated
// (outcome "error", logged at Error); a named cause wrapped with it wins.
func TestClassifyRequestTime(t *testing.T) {
	for _, c := range []struct {
		err           error
		status        int
		code, outcome string
	}{
		{fmt.Errorf("read stock: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, "unavailable", "unavailable"},
		{fmt.Errorf("read stock: %w", context.Canceled), http.StatusServiceUnavailable, "unavailable", "unavailable"},
		{fmt.Errorf("%w: %w", ErrLockTimeout, context.DeadlineExceeded), http.StatusServiceUnavailable, "lock_timeout", "lock_timeout"},
		{fmt.Errorf("%w: %w", storage.ErrOutOfStock, context.Canceled), http.StatusConflict, "out_of_stock", "out_of_stock"},
		{fmt.Errorf("mysql: bad connection"), http.StatusServiceUnavailable, "unavailable", "error"},
	} {
		status, code, _, outcome := classify(c.err)
		if status != c.status || code != c.code || outcome != c.outcome {
			t.Errorf("classify(%v) = %d %s outcome %s, want %d %s outcome %s", c.err, status, code, outcome, c.status, c.code, c.outcome)
		}
	}
}
