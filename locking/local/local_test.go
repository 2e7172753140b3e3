package local_test

import (
	"context"
	"testing"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/locking/locktest"
)

// config is empty: a local lock has nothing to configure.
type config struct{}

func open(context.Context, config) (locking.Locker, error) { return local.New(), nil }

func TestMain(m *testing.M) { locktest.Main(m, open) }

func TestConformance(t *testing.T) {
	locktest.Run(t, locktest.Backend[config]{Name: "local", InProcess: true})
}
