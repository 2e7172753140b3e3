package clock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ended, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on an ended ctx = %v, want context.Canceled", err)
	}
	if err := Sleep(ended, 0); err != nil {
		t.Errorf("Sleep(0) on an ended ctx = %v, want nil: no wait was asked for", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep(1ms) = %v, want nil", err)
	}
}
