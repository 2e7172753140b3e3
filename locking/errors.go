package locking

import (
	"context"
	"errors"
	"fmt"
)

// AcquireError is the error an Acquire of key returns for err, as the
// contract words it: one that wraps ctx.Err() when ctx ended the wait, and
// otherwise ErrUnavailable (a backend's own sentinel errors, such as a
// queue entry that vanished too often, included).
func AcquireError(ctx context.Context, key string, err error) error {
	switch {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return fmt.Errorf("acquire %q: %w", key, err)
	case errors.Is(err, ErrUnavailable):
		return fmt.Errorf("acquire %q: %w", key, err)
	default:
		return fmt.Errorf("acquire %q: %w: %w", key, ErrUnavailable, err)
	}
}
