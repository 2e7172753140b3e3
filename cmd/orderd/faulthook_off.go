//go:build !labfaults

// The default build has no fault hook: faulthook_lab.go (-tags labfaults)
// is the lab's side. OVERSOLD_FAULT_HOOK set on this build stops orderd
// rather than being ignored, so a lab run on the wrong binary says so
// instead of injecting nothing.
package main

import (
	"errors"
	"log/slog"

	"github.com/oversold-lab/oversold/order"
)

// faultHooks reports whether this build carries the lab's fault hook.
const faultHooks = false

// logLevel is the lowest level logged: info (start, settings, failures;
// the lease records are at debug).
const logLevel = slog.LevelInfo

// refuseLabOnly is a configError when a lab-only variable is set.
func refuseLabOnly(getenv func(string) string) error {
	if getenv("OVERSOLD_FAULT_HOOK") != "" {
		return &configError{Var: "OVERSOLD_FAULT_HOOK", Err: errors.New("this orderd is built without the lab's fault hook (go build -tags labfaults)")}
	}
	return nil
}

// faultHook is no observer in this build.
func faultHook(string, string, *slog.Logger) []order.Observer { return nil }
