package order

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/oversold-lab/oversold/locking"
	"github.com/oversold-lab/oversold/storage"
)

// API limits of docs/design.md.
const (
	maxBody        = 64 << 10
	maxQuantity    = 1000
	maxStock       = 1_000_000_000
	maxKeyLength   = 255 // the idempotency_key column
	retryAfterSecs = "1"
)

var skuPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (s *Service) routes() http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.limit(), noOptions)
	e.POST("/v1/orders", s.postOrder)
	e.GET("/v1/orders/:id", s.getOrder)
	e.POST("/v1/reservations", s.postReservation)
	e.GET("/v1/reservations/:id", s.getReservation)
	e.POST("/v1/reservations/:id/confirm", s.confirmReservation)
	e.POST("/v1/reservations/:id/cancel", s.cancelReservation)
	e.GET("/v1/inventory/:sku", s.getInventory)
	e.PUT("/v1/inventory/:sku", s.putInventory)
	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(s.metrics.Handler()))
	e.GET("/openapi.json", serveOpenAPI)
	return e
}

// noOptions answers OPTIONS on a known path as any other method it does
// not serve: 405 (echo's router would answer 204).
func noOptions(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if allow, _ := c.Get(echo.ContextKeyHeaderAllow).(string); c.Request().Method == http.MethodOptions && allow != "" {
			return echo.ErrMethodNotAllowed
		}
		return next(c)
	}
}

// postOrder: POST /v1/orders {"sku","quantity"}, optional Idempotency-Key.
func (s *Service) postOrder(c echo.Context) error {
	req, err := parseOrder(c)
	if err == nil {
		var o Order
		var replayed bool
		if o, replayed, err = s.Place(c.Request().Context(), req); err == nil {
			return s.placed(c, o, replayed)
		}
	}
	_, _, _, outcome := classify(err)
	s.metrics.orders.WithLabelValues(outcome).Inc()
	return err // handleError answers, and logs what nobody anticipated
}

func (s *Service) placed(c echo.Context, o Order, replayed bool) error {
	c.Response().Header().Set("Location", "/v1/orders/"+o.ID)
	if replayed {
		s.metrics.orders.WithLabelValues("replayed").Inc()
		s.log.Info("order replayed", "sku", o.SKU, "order_id", o.ID)
		return c.JSON(http.StatusOK, o)
	}
	if o.Status == StatusPending { // accept queue: written later
		s.metrics.orders.WithLabelValues("accepted").Inc()
		return c.JSON(http.StatusAccepted, o)
	}
	s.metrics.orders.WithLabelValues("created").Inc()
	s.log.Info("order placed", "sku", o.SKU, "order_id", o.ID, "quantity", o.Quantity, "token", o.Token)
	return c.JSON(http.StatusCreated, o)
}

func parseOrder(c echo.Context) (Request, error) {
	var req Request
	var err error
	if req.Key, err = idempotencyKey(c); err != nil {
		return req, err
	}
	obj, err := readObject(c, "sku", "quantity")
	if err != nil {
		return req, err
	}
	if req.SKU, err = skuField(obj["sku"]); err != nil {
		return req, err
	}
	req.Quantity, err = intField(obj, "quantity", 1, maxQuantity)
	return req, err
}

// idempotencyKey is the request's Idempotency-Key header, "" for none.
// The header given twice, or given empty, is refused: a proxy that keeps
// another of the values, or drops an empty one, would see another request.
func idempotencyKey(c echo.Context) (string, error) {
	values := c.Request().Header.Values("Idempotency-Key")
	if len(values) > 1 {
		return "", invalid("Idempotency-Key must be given at most once")
	}
	if len(values) == 0 {
		return "", nil
	}
	key := values[0]
	if key == "" {
		return "", invalid("Idempotency-Key must not be empty")
	}
	if len(key) > maxKeyLength || strings.IndexFunc(key, func(r rune) bool { return r < ' ' || r > '~' }) >= 0 {
		return "", invalid("Idempotency-Key must be at most %d printable ASCII characters", maxKeyLength)
	}
	return key, nil
}

// getOrder: GET /v1/orders/{id}.
func (s *Service) getOrder(c echo.Context) error {
	id := c.Param("id")
	// Ids are exact strings: only the canonical spelling can exist (no
	// upper case, braces or urn: prefix that uuid.Parse would accept).
	if u, err := uuid.Parse(id); err != nil || u.String() != id {
		return fmt.Errorf("order %q: %w", id, storage.ErrNotFound)
	}
	o, err := s.orderView(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}

// getInventory: GET /v1/inventory/{sku}, from MySQL, the truth.
func (s *Service) getInventory(c echo.Context) error {
	sku := c.Param("sku")
	if !skuPattern.MatchString(sku) {
		return fmt.Errorf("sku %q: %w", sku, storage.ErrUnknownSKU) // cannot exist
	}
	inv, err := s.store.Inventory(c.Request().Context(), sku)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, inventoryView(inv))
}

// inventoryJSON is a SKU as GET and PUT /v1/inventory/{sku} show it.
type inventoryJSON struct {
	SKU      string `json:"sku"`
	Stock    int64  `json:"stock"`
	Reserved int64  `json:"reserved"`
	Version  uint64 `json:"version"`
}

func inventoryView(inv storage.Inventory) inventoryJSON {
	return inventoryJSON{SKU: inv.SKU, Stock: inv.Stock, Reserved: inv.Reserved, Version: inv.Version}
}

// putInventory: PUT /v1/inventory/{sku} {"stock"}, admin only, optional
// If-Match: <version> (a bare or quoted number). See SetStock.
func (s *Service) putInventory(c echo.Context) error {
	if err := s.authorize(c.Request()); err != nil {
		return err
	}
	sku := c.Param("sku")
	if !skuPattern.MatchString(sku) {
		return invalid("sku must be 1 to 64 letters, digits, '-', '_' or '.'")
	}
	var ifVersion uint64
	if h := c.Request().Header.Get("If-Match"); h != "" {
		v, err := strconv.ParseUint(strings.Trim(h, `"`), 10, 64)
		if err != nil || v == 0 {
			return invalid("If-Match must be a version: a positive integer")
		}
		ifVersion = v
	}
	obj, err := readObject(c, "stock")
	if err != nil {
		return err
	}
	stock, err := intField(obj, "stock", 0, maxStock)
	if err != nil {
		return err
	}
	inv, err := s.SetStock(c.Request().Context(), sku, stock, ifVersion)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, inventoryView(inv))
}

// authorize checks the admin bearer token in constant time. Both sides are
// hashed first, so the comparison does not even leak the token's length.
// An empty OVERSOLD_ADMIN_TOKEN disables the admin routes: 401 for all.
func (s *Service) authorize(r *http.Request) error {
	if s.cfg.AdminToken == "" {
		return fmt.Errorf("%w: admin routes are disabled (OVERSOLD_ADMIN_TOKEN is empty)", ErrUnauthorized)
	}
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	got := sha256.Sum256([]byte(token))
	if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], s.admin[:]) != 1 {
		return fmt.Errorf("%w: want Authorization: Bearer <admin token>", ErrUnauthorized)
	}
	return nil
}

// readObject reads the body as one JSON object whose keys are exactly
// fields (case-sensitive: encoding/json alone would take "SKU" for "sku").
// Anything else is ErrInvalid: a Content-Type other than application/json,
// a body over 64 KiB, malformed JSON, trailing data, a member given twice,
// unknown or missing fields.
func readObject(c echo.Context, fields ...string) (map[string]json.RawMessage, error) {
	return readFields(c, fields, nil)
}

// readFields is readObject with optional fields besides the required ones.
func readFields(c echo.Context, required, optional []string) (map[string]json.RawMessage, error) {
	r := c.Request()
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, invalid("Content-Type must be application/json")
	}
	// The cap's middleware has read the body already (limit.go); this
	// read of its copy keeps the handler's own bound.
	body, err := io.ReadAll(http.MaxBytesReader(c.Response().Writer, r.Body, maxBody))
	if err != nil {
		return nil, bodyError(err)
	}
	obj, err := members(body, "")
	if errors.Is(err, errNotObject) {
		return nil, invalid("body must be one JSON object")
	}
	if err != nil {
		return nil, err
	}
	return obj, checkFields(obj, required, optional)
}

// errNotObject: members' input is not one JSON object (its own message
// would quote the decoder, which a client is never told).
var errNotObject = fmt.Errorf("%w: not one JSON object", ErrInvalid)

// members returns the members of data, which must be exactly one JSON
// object; where names it in a message ("" for the body). A member given
// twice is refused: encoding/json keeps the last value, while a proxy or a
// log may read the first, and then the request served is not the one they
// saw. Names are compared as decoded, so
// "qu\u0061ntity" is "quantity" given again.
func members(data []byte, where string) (map[string]json.RawMessage, error) {
	if !json.Valid(data) {
		return nil, errNotObject
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errNotObject
	}
	obj := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		name, ok := tok.(string)
		if err != nil || !ok {
			return nil, errNotObject
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, errNotObject
		}
		if _, dup := obj[name]; dup {
			return nil, invalid("%smember %q is in the object more than once", where, name)
		}
		obj[name] = value
	}
	// json.Valid vouched for the closing brace and for nothing after it.
	return obj, nil
}

// checkFields refuses unknown and missing fields of obj.
func checkFields(obj map[string]json.RawMessage, required, optional []string) error {
	for k := range obj {
		if !slices.Contains(required, k) && !slices.Contains(optional, k) {
			return invalid("unknown field %q", k)
		}
	}
	for _, f := range required {
		if _, ok := obj[f]; !ok {
			return invalid("missing field %q", f)
		}
	}
	return nil
}

func skuField(raw json.RawMessage) (string, error) {
	var sku string
	if err := json.Unmarshal(raw, &sku); err != nil || !skuPattern.MatchString(sku) {
		return "", invalid("sku must be a string of 1 to 64 letters, digits, '-', '_' or '.'")
	}
	return sku, nil
}

// intField reads a JSON integer in [lo, hi]. It parses the raw literal:
// 1.5, 1e3, "1" and numbers beyond int64 are all refused.
func intField(obj map[string]json.RawMessage, name string, lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(string(obj[name]), 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, invalid("%s must be an integer from %d to %d", name, lo, hi)
	}
	return n, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// errorCodes maps domain errors to answers: the one place that does. The
// message is the whole of what a client is told: what it did wrong, never
// stock figures, addresses or driver errors (they go to the log). Only
// invalid_request and unauthorized carry their error's own text, which
// this package wrote about the request.
var errorCodes = []struct {
	err     error
	status  int
	code    string
	message string
}{
	{ErrInvalid, http.StatusBadRequest, "invalid_request", ""},
	{ErrUnauthorized, http.StatusUnauthorized, "unauthorized", ""},
	{storage.ErrUnknownSKU, http.StatusNotFound, "unknown_sku", "no such sku"},
	{storage.ErrNotFound, http.StatusNotFound, "not_found", "no such order"},
	{storage.ErrNoReservation, http.StatusNotFound, "not_found", "no such reservation"},
	{ErrReservationExpired, http.StatusConflict, "reservation_expired", "the reservation expired; its stock is given back"},
	{ErrReservationCancelled, http.StatusConflict, "reservation_cancelled", "the reservation was cancelled"},
	{ErrReservationConfirmed, http.StatusConflict, "reservation_confirmed", "the reservation was confirmed"},
	{storage.ErrOutOfStock, http.StatusConflict, "out_of_stock", "not enough stock for the quantity ordered"},
	{ErrLockLost, http.StatusConflict, "lock_lost", "the lock was lost before the write; nothing was written"},
	{storage.ErrConflict, http.StatusConflict, "conflict", "the stock kept changing; nothing was written, try again"},
	{storage.ErrPrecondition, http.StatusPreconditionFailed, "precondition_failed", "If-Match is not the sku's current version"},
	{ErrKeyReused, http.StatusUnprocessableEntity, "idempotency_key_reused", "this Idempotency-Key was sent before with another request"},
	{ErrLockTimeout, http.StatusServiceUnavailable, "lock_timeout", "the sku's lock was not granted in time; retry later"},
	{ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "a server the service needs did not answer; retry later"},
	{locking.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "a server the service needs did not answer; retry later"},
	// Last: a cause above says more. The request's own time ran out
	// (OVERSOLD_REQUEST_TIMEOUT), or its client left.
	{context.DeadlineExceeded, http.StatusServiceUnavailable, "unavailable", "the request ran out of time; retry later"},
	{context.Canceled, http.StatusServiceUnavailable, "unavailable", "the request was cancelled; retry later"},
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// unanticipated is the message of a failure nobody anticipated.
const unanticipated = "internal failure; retry later"

// classify returns err's answer, its public message and its outcome label.
// An error nobody anticipated (MySQL or Redis failing mid-request, a client
// gone) is 503 unavailable to the client and outcome "error" in the metrics.
func classify(err error) (status int, code, message, outcome string) {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			message = c.message
			if short := (*storage.OutOfStock)(nil); errors.As(err, &short) {
				message = fmt.Sprintf("not enough stock for the quantity of %s %s", plural(len(short.SKUs), "sku", "skus"), strings.Join(short.SKUs, ", "))
			}
			if message == "" {
				message = strings.TrimPrefix(err.Error(), c.err.Error()+": ")
			}
			if c.code == "invalid_request" {
				return c.status, c.code, message, "invalid"
			}
			return c.status, c.code, message, c.code
		}
	}
	return http.StatusServiceUnavailable, "unavailable", unanticipated, "error"
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// handleError is echo's error handler: every error answer is
// {"error":{"code","message"}}.
func (s *Service) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	status, code, msg, outcome := classify(err)
	var he *echo.HTTPError
	switch {
	case errors.As(err, &he): // echo's own: no route, wrong method
		status, code, msg = he.Code, "invalid_request", fmt.Sprint(he.Message)
		if status == http.StatusNotFound {
			code = "not_found"
		}
	case outcome == "error":
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Path(), "err", err)
	case status >= 500:
		s.log.Warn("request refused", "method", c.Request().Method, "path", c.Path(), "code", code, "err", err)
	}
	h := c.Response().Header()
	switch status {
	case http.StatusMethodNotAllowed: // the methods the path serves (RFC 9110)
		if allow, _ := c.Get(echo.ContextKeyHeaderAllow).(string); allow != "" {
			h.Set("Allow", strings.TrimPrefix(allow, "OPTIONS, ")) // OPTIONS is refused too
		}
	case http.StatusServiceUnavailable:
		h.Set("Retry-After", retryAfterSecs)
	case http.StatusUnauthorized:
		h.Set("WWW-Authenticate", `Bearer realm="oversold admin"`)
	}
	body := map[string]apiError{"error": {Code: code, Message: msg}}
	if err := c.JSON(status, body); err != nil {
		s.log.Warn("writing error answer failed", "err", err)
	}
}
