package zklock_test

import (
	"testing"

	"github.com/oversold-lab/oversold/internal/testbed"
	"github.com/oversold-lab/oversold/locking/zklock/internal/zklocktest"
)

// The recipe alone: when the reply to our create is lost, the create may or
// may not have happened. Acquire must find the node it made and leave none
// behind: a node of ours that nobody deletes sits, kept alive by our own
// session, ahead of every later Acquire of the key.
func TestLostCreateReplyFound(t *testing.T) {
	zklocktest.LostCreateReply(t, testbed.ZooKeeper(t), nil) // nil: the recipe's CreateOnce
}
