package loadtest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestResetStockRetries503: a reset answered 503 is tried again until it
// succeeds, at most resetTries times; any other refusal is not retried.
func TestResetStockRetries503(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      int // answers before a 200
		code      int
		wantTries int
		wantErr   string
	}{
		{"503 twice, then 200", 2, http.StatusServiceUnavailable, 3, ""},
		{"503 always", 100, http.StatusServiceUnavailable, resetTries, "503 Service Unavailable"},
		{"401 is not retried", 100, http.StatusUnauthorized, 1, "401 Unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tries atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPut || r.URL.Path != "/v1/inventory/sku-1" {
					t.Errorf("%s %s", r.Method, r.URL.Path)
				}
				if int(tries.Add(1)) <= tc.fail {
					w.WriteHeader(tc.code)
					return
				}
				w.WriteHeader(http.StatusOK)
			}))
			defer srv.Close()
			err := ResetStock(t.Context(), srv.URL, "token", "sku-1", 10)
			if got := int(tries.Load()); got != tc.wantTries {
				t.Errorf("%d tries, want %d", got, tc.wantTries)
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
