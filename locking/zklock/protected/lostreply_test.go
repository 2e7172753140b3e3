package protected_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
	"github.com/oversold-lab/oversold/locking/zklock/protected"
)

// When the reply to our create is lost, the create may or may not have
// happened: Acquire must find the node it made instead of making a second
// one that nobody would ever delete.
func TestLostCreateReplyLeavesNoOrphan(t *testing.T) {
	zklocktest.LostCreateReply(t, testbed.ZooKeeper(t), protected.Create)
}
