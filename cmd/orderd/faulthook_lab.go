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

// faultHook is the lab's observer of the order flow (OVERSOLD_FAULT_HOOK):
// at each fault point (order.HookPoint.Fault), a blocking GET on the lab's
// URL, which answers when its fault is done with this replica. None when
// the setting is empty.
func faultHook(hookURL, instance string, log *slog.Logger) []order.Observer {
	if hookURL == "" {
		return nil
	}
	log.Warn("fault hook set: for the lab only", "url", hookURL)
	return []order.Observer{&labHook{url: hookURL, instance: instance, log: log, client: &http.Client{Timeout: faultHookWait}}}
}

// labHook calls the lab's URL at the fault points and waits for its answer.
type labHook struct {
	url, instance string
	log           *slog.Logger
	client        *http.Client
}

// Observe calls the lab at e's fault point; every other step passes.
func (l *labHook) Observe(ctx context.Context, e order.Event) {
	if !e.At.Fault() {
		return
	}
	q := url.Values{
		"at": {string(e.At)}, "replica": {l.instance}, "sku": {e.SKU},
		"key": {e.Key}, "token": {strconv.FormatUint(e.Token, 10)},
	}
	if e.Reservation != "" {
		q.Set("reservation", e.Reservation)
		q.Set("op", e.Op)
	}
	u := l.url + "?" + q.Encode()
	if strings.Contains(l.url, "?") {
		u = l.url + "&" + q.Encode()
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, u, nil)
	if err == nil {
		var resp *http.Response
		if resp, err = l.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if err != nil {
		l.log.Warn("fault hook failed", "at", string(e.At), "err", err)
	}
}
