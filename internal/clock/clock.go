// Package clock holds the one wait on a context that the product, the
// locks and the lab share. It imports nothing of the project, so any
// package may use it without an upward import.
package clock

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, and says which: nil after d, else
// ctx's error. A d of zero or less returns nil at once, even if ctx has
// ended: no wait was asked for, so none was cut short.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
