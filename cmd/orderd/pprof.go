//go:build pprof

// Profiling, for the lab only: built in with `go build -tags pprof
// ./cmd/orderd`, never in a default build or the deploy images. With
// OVERSOLD_PPROF_ADDR set (e.g. 127.0.0.1:0) such a binary also serves
// net/http/pprof on that address, on a listener of its own (never on the
// API's), and logs the address it bound as {"msg":"pprof","addr":...}.
// Unset, it serves nothing.
//
//	go build -tags pprof -o /tmp/orderd-pprof ./cmd/orderd
//	go tool pprof http://ADDR/debug/pprof/profile?seconds=5
package main

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("OVERSOLD_PPROF_ADDR")
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		slog.Error("pprof: listen", "addr", addr, "err", err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	slog.New(slog.NewJSONHandler(os.Stderr, nil)).Warn("pprof", "addr", ln.Addr().String(), "note", "lab only")
	go func() { _ = http.Serve(ln, mux) }()
}
