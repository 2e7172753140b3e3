package fairqueue

import (
	"github.com/redis/go-redis/v9"

	"github.com/oversold-lab/oversold/locking/internal/waitq"
	"github.com/oversold-lab/oversold/locking/redislock"
)

// BareDel is the broken variant of this queue that the suite must fail
// (locktest.Teeth): its release deletes the key whoever owns it.
const BareDel = "bare-del"

// Broken is New with the broken variant named, if it is this package's.
func Broken(variant string) func(redislock.Base) redislock.Queue {
	scripts := waitq.Default
	if variant == BareDel {
		scripts.Release = redis.NewScript(`return redis.call('del', KEYS[1])`)
	}
	return func(b redislock.Base) redislock.Queue { return newQueue(b, scripts) }
}
