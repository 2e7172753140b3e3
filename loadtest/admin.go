package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// ResetStock sets sku's stock through the admin API (PUT /v1/inventory/{sku}),
// which creates or resets the SKU in MySQL and refreshes the Redis cache:
// the only way a run starts from a known state without reaching around the
// service. A 503 (a server the replica needs did not answer in time, as on
// a loaded machine just after a fault run restarted a node) is tried again,
// up to resetTries times: the reset sets an absolute stock, so a second
// try is harmless, and it is the run's setup, not what the run measures.
func ResetStock(ctx context.Context, base, token, sku string, stock int) error {
	for try := 1; ; try++ {
		retry, err := resetStock(ctx, base, token, sku, stock)
		if !retry {
			return err
		}
		if try == resetTries {
			return fmt.Errorf("%w (%d tries)", err, resetTries)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try) * 250 * time.Millisecond):
		}
	}
}

// resetTries bounds ResetStock's tries on 503.
const resetTries = 5

// resetStock is one try of ResetStock; retry says the answer was 503.
func resetStock(ctx context.Context, base, token, sku string, stock int) (retry bool, err error) {
	body, _ := json.Marshal(map[string]int{"stock": stock})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/inventory/"+url.PathEscape(sku), bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("reset stock of %s: %w", sku, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("reset stock of %s: %w", sku, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.StatusCode == http.StatusServiceUnavailable, fmt.Errorf("reset stock of %s: %s: %s", sku, resp.Status, bytes.TrimSpace(msg))
	}
	return false, nil
}
