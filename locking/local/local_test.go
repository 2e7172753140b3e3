package local_test

import (
	"testing"

	"github.com/oversold-lab/oversold/locking/locktest"
)

func TestMain(m *testing.M) { locktest.Main(m) }

func TestConformance(t *testing.T) {
	locktest.Run(t, locktest.Backend{Name: "local", InProcess: true})
}
