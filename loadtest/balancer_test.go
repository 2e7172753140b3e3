package loadtest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestBalancerRoundRobin(t *testing.T) {
	var urls []string
	for i := range 3 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "r%d %s", i+1, r.URL.Path)
		}))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	lb, err := NewBalancer(urls, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close(t.Context())

	seen := map[string]int{}
	for range 9 {
		resp, err := http.Get(lb.URL + "/v1/orders")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen[string(body)]++
	}
	want := map[string]int{"r1 /v1/orders": 3, "r2 /v1/orders": 3, "r3 /v1/orders": 3}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("answers %v, want %v", seen, want)
	}
}

func TestBalancerReplicaDown(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	lb, err := NewBalancer([]string{url}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close(t.Context())
	resp, err := http.Get(lb.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502 for a replica that is down", resp.StatusCode)
	}
}
