//go:build labfaults

// The lab's fault hook, built in only with `go build -tags labfaults
// ./cmd/orderd` (the lab and its tests build orderd so), never in a default
// build or the deploy images: whoever answers the hook's URL can stall every
// order. faulthook_off.go is the default build's side.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/oversold-lab/oversold/order"
)

// faultHooks reports whether this build carries the lab's fault hook.
const faultHooks = true

// logLevel is the lowest level logged: debug, for the lease records the
// lab reads from the replicas' logs.
const logLevel = slog.LevelDebug

// faultHookSetting is the one variable outside docs/design.md's table: off
// by default. Set, the order flow calls GET on the URL, and waits for the
// answer, at fixed points of the flow (order.HookPoint), so the lab's fault
// can pause (SIGSTOP) or kill the replica exactly there.
var faultHookSetting = setting{"OVERSOLD_FAULT_HOOK", "", "lab only: URL the flow calls and waits for inside the critical section", func(c *config, v string) error {
	c.FaultHook = v
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil {
		return err
	}
	if u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("%q is not an http:// URL", v)
	}
	return nil
}}

func init() { settings = append(settings, faultHookSetting) }

// refuseLabOnly refuses nothing: this build has the lab's settings.
func refuseLabOnly(func(string) string) error { return nil }

// faultHookWait bounds one call of the lab's fault hook: longer than any
// pause the lab holds a replica in it.
const faultHookWait = 2 * time.Minute

// faultHook is the order flow's lab-only hook (OVERSOLD_FAULT_HOOK): a
// blocking GET on the lab's URL, which answers when its fault is done with
// this replica. nil when the setting is empty.
func faultHook(hookURL, instance string, log *slog.Logger) func(context.Context, order.HookPoint, order.HookInfo) {
	if hookURL == "" {
		return nil
	}
	log.Warn("fault hook set: for the lab only", "url", hookURL)
	client := &http.Client{Timeout: faultHookWait}
	return func(ctx context.Context, at order.HookPoint, h order.HookInfo) {
		q := url.Values{
			"at": {string(at)}, "replica": {instance}, "sku": {h.SKU},
			"key": {h.Key}, "token": {strconv.FormatUint(h.Token, 10)},
		}
		if h.Reservation != "" {
			q.Set("reservation", h.Reservation)
			q.Set("op", h.Op)
		}
		u := hookURL + "?" + q.Encode()
		if strings.Contains(hookURL, "?") {
			u = hookURL + "&" + q.Encode()
		}
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, u, nil)
		if err == nil {
			var resp *http.Response
			if resp, err = client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		if err != nil {
			log.Warn("fault hook failed", "at", string(at), "err", err)
		}
	}
}
