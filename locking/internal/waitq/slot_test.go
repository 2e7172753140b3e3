package waitq_test

import (
	"testing"

	"github.com/oversold-lab/oversold/locking/internal/waitq"
)

// The slots are CLUSTER KEYSLOT's answers (redis-server 7.0.15), hash tags'
// corner cases included: the Notifier finds the channels a MOVED reply is
// about by slot.
func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":                             12739, // CRC16/XMODEM's check value, 0x31C3
		"foo":                                   12182,
		"somekey":                               11058,
		"foo{hash_tag}":                         2515,
		"foo{}{bar}":                            8363, // an empty tag: the whole key
		"foo{{bar}}zap":                         4015, // "{bar"
		"foo{bar}{zap}":                         5061, // the first tag
		"{}":                                    15257,
		"{":                                     4092,
		"}":                                     12090,
		"":                                      0,
		"{a}b":                                  15495,
		"lock:{order-42}:wake:0123456789abcdef": 9984,
	} {
		if got := waitq.Slot(key); got != want {
			t.Errorf("slot of %q: %d, want %d", key, got, want)
		}
	}
}
