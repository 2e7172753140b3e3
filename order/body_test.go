package order_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
)

// decoderWords are what Go's JSON decoder says, or a Go type's spelling:
// none belongs in an answer, which speaks of the request alone.
var decoderWords = []string{
	"json:", "json.", "unmarshal", "Unmarshal", "Go value", "Go struct", "map[", "[]", "RawMessage",
	"interface", "invalid character", "looking for beginning", "EOF", "struct", "int64", "string literal",
}

// TestStrictBodies: on every route that reads a body, a body that is not
// exactly one JSON object with each member once (at the top and inside a
// reservation's lines) is 400 invalid_request, whose message quotes no
// decoder and names no Go type, and changes nothing. Before, a duplicated
// member was taken with its last value, and an array's 400 quoted
// "cannot unmarshal array into Go value of type map[string]json.RawMessage".
func TestStrictBodies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.service(local.New(), order.Config{Lock: "local", AdminToken: adminToken}).Handler()
	f.stock("sb-a", 2000)
	f.stock("sb-b", 2000)
	auth := []string{"Authorization", "Bearer " + adminToken}

	// Malformed bodies every route refuses alike.
	malformed := map[string]string{
		"array":              `[{"sku":"sb-a","quantity":1}]`,
		"string":             `"sb-a"`,
		"number":             `1`,
		"true":               `true`,
		"null":               `null`,
		"empty":              ``,
		"truncated":          `{"sku":"sb-a","quantity":`,
		"bad character":      `{"sku":"sb-a",quantity:1}`,
		"not JSON":           `sku=sb-a&quantity=1`,
		"unclosed string":    `{"sku":"sb-a`,
		"trailing object":    `{"stock":1}{"stock":1}`,
		"trailing garbage":   `{"stock":1} x`,
		"bad escape":         `{"sku":"\x","quantity":1}`,
		"deep nesting":       strings.Repeat("[", 20000) + strings.Repeat("]", 20000),
		"control in string":  "{\"sku\":\"sb\x01a\",\"quantity\":1}",
		"duplicate key null": `{"stock":1,"stock":null}`,
	}
	routes := []struct {
		name, method, path string
		header             []string
		// dups are bodies whose only fault is a duplicated member: every
		// other member is right, and each value alone would be taken.
		dups map[string]string
	}{
		{"POST /v1/orders", http.MethodPost, "/v1/orders", nil, map[string]string{
			"quantity twice":          `{"sku":"sb-a","quantity":1000,"quantity":1}`,
			"sku twice":               `{"sku":"sb-b","sku":"sb-a","quantity":1}`,
			"same value twice":        `{"sku":"sb-a","quantity":1,"quantity":1}`,
			"escaped spelling":        `{"sku":"sb-a","quantity":1,"quant\u0069ty":2}`,
			"twice after whitespace":  "{\"sku\":\"sb-a\",\n\t\"quantity\":1 ,\"quantity\" : 1}",
			"sku twice, first bad":    `{"sku":"no such","sku":"sb-a","quantity":1}`,
			"quantity twice, 2nd bad": `{"sku":"sb-a","quantity":1,"quantity":0}`,
		}},
		{"POST /v1/reservations", http.MethodPost, "/v1/reservations", nil, map[string]string{
			"lines twice":          `{"lines":[{"sku":"sb-a","quantity":1000}],"lines":[{"sku":"sb-a","quantity":1}]}`,
			"ttl twice":            `{"lines":[{"sku":"sb-a","quantity":1}],"ttl_seconds":60,"ttl_seconds":600}`,
			"quantity in a line":   `{"lines":[{"sku":"sb-a","quantity":1000,"quantity":1}]}`,
			"sku in a line":        `{"lines":[{"sku":"sb-b","sku":"sb-a","quantity":1}]}`,
			"in the second line":   `{"lines":[{"sku":"sb-a","quantity":1},{"sku":"sb-b","quantity":5,"quantity":1}]}`,
			"escaped in a line":    `{"lines":[{"sku":"sb-a","quantity":1,"\u0071uantity":1}]}`,
			"escaped at the top":   `{"lines":[{"sku":"sb-a","quantity":1}],"l\u0069nes":[{"sku":"sb-a","quantity":1}]}`,
			"lines twice, 1st bad": `{"lines":7,"lines":[{"sku":"sb-a","quantity":1}]}`,
		}},
		{"PUT /v1/inventory/{sku}", http.MethodPut, "/v1/inventory/sb-a", auth, map[string]string{
			"stock twice":      `{"stock":0,"stock":5}`,
			"same value twice": `{"stock":5,"stock":5}`,
			"escaped spelling": `{"stock":0,"st\u006fck":5}`,
		}},
	}
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			cases := map[string]string{}
			for name, body := range malformed {
				cases["malformed: "+name] = body
			}
			for name, body := range r.dups {
				cases["duplicate: "+name] = body
			}
			for name, body := range cases {
				t.Run(name, func(t *testing.T) {
					header := append([]string{"Content-Type", "application/json"}, r.header...)
					rec := call(h, r.method, r.path, body, header...)
					var e struct {
						Error struct{ Code, Message string }
					}
					if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != "invalid_request" {
						t.Fatalf("%d %s, want 400 invalid_request", rec.Code, rec.Body)
					}
					for _, w := range decoderWords {
						if strings.Contains(e.Error.Message, w) {
							t.Errorf("message %q quotes the decoder or a Go type (%q)", e.Error.Message, w)
						}
					}
					if strings.HasPrefix(name, "duplicate") && !strings.Contains(e.Error.Message, "more than once") {
						t.Errorf("message %q does not say a member is there more than once", e.Error.Message)
					}
				})
			}
		})
	}
	for _, sku := range []string{"sb-a", "sb-b"} {
		if a := f.audit(sku); a.Stock != 2000 || a.Reserved != 0 || a.Orders != 0 {
			t.Errorf("%s after refused bodies: %+v, want stock 2000, nothing reserved or ordered", sku, a)
		}
		if inv, err := f.store.Inventory(t.Context(), sku); err != nil || inv.Version != 1 {
			t.Errorf("%s: %+v %v, want version 1, untouched", sku, inv, err)
		}
	}

	// The same bodies without their duplicate are taken: the refusal was
	// the duplicate's alone.
	wantCode(t, call(h, http.MethodPost, "/v1/orders", `{"sku":"sb-a","quantity":1}`), 201, "")
	wantCode(t, call(h, http.MethodPost, "/v1/reservations", `{"lines":[{"sku":"sb-a","quantity":1},{"sku":"sb-b","quantity":1}],"ttl_seconds":60}`), 201, "")
	wantCode(t, call(h, http.MethodPut, "/v1/inventory/sb-b", ` { "stock" : 5 } `+"\n", auth...), 200, "")
}
