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
// service.
func ResetStock(ctx context.Context, base, token, sku string, stock int) error {
	body, _ := json.Marshal(map[string]int{"stock": stock})
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/inventory/"+url.PathEscape(sku), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("reset stock of %s: %w", sku, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("reset stock of %s: %w", sku, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("reset stock of %s: %s: %s", sku, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
