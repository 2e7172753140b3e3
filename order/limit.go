package order

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// Overload: a replica serves at most Config.MaxInFlight API requests at
// once and refuses the rest at once, 503 with a jittered Retry-After, rather
// than queueing them without bound: a queue only adds latency past the
// client's own timeout while it holds goroutines, memory and, further in,
// MySQL connections. Each API request also runs under Config.RequestTimeout.
const (
	DefaultMaxInFlight    = 256
	DefaultRequestTimeout = 15 * time.Second
	// retryAfterMax: a refused client is told to wait 1 to retryAfterMax
	// seconds, spread so refused clients do not come back in one wave.
	retryAfterMax = 3
)

// maxBodyWait bounds the time a client has to send its request's headers
// and body, whatever the request timeout: a 64 KiB body takes far less on
// any working link, and a client that stalls holds a connection no longer.
const maxBodyWait = 20 * time.Second

// ReadTimeout is the time a client has to send its whole request, headers
// and body: the request timeout, at most 20 s. The server running the
// handler must bound its reads with it (http.Server.ReadTimeout, as
// cmd/orderd sets it): a request takes no in-flight slot until its body is
// in, so that bound is what disconnects clients that stall their bodies.
func (s *Service) ReadTimeout() time.Duration { return min(s.cfg.RequestTimeout, maxBodyWait) }

// limited reports whether the cap and the deadline apply to a path: the
// API, not the probes and metrics an operator needs most under load.
func limited(path string) bool { return strings.HasPrefix(path, "/v1/") }

// limit is the middleware of the cap and the deadline.
func (s *Service) limit() echo.MiddlewareFunc {
	slots := make(chan struct{}, s.cfg.MaxInFlight)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if !limited(r.URL.Path) {
				return next(c)
			}
			// A request takes a slot once it can be served: its body read
			// whole, bounded in size and time. Clients that send headers
			// and then stall their bodies would otherwise hold every slot
			// while they stall, and ordinary requests be refused.
			// Routes that read no body never wait for one.
			if bodyRoutes[r.Method+" "+c.Path()] {
				body, err := s.readBody(c)
				if err != nil {
					return err
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			select {
			case slots <- struct{}{}:
				defer func() { <-slots }()
			default:
				s.metrics.refused.Inc()
				c.Response().Header().Set("Retry-After", strconv.Itoa(1+rand.IntN(retryAfterMax)))
				return c.JSON(http.StatusServiceUnavailable, map[string]apiError{"error": {
					Code:    "unavailable",
					Message: fmt.Sprintf("this replica is serving %d requests, its limit; retry after Retry-After seconds", s.cfg.MaxInFlight),
				}})
			}
			ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
			defer cancel()
			c.SetRequest(r.WithContext(ctx))
			return next(c)
		}
	}
}

// bodyRoutes are the routes whose handlers read a body (readObject).
var bodyRoutes = map[string]bool{
	"POST /v1/orders":        true,
	"POST /v1/reservations":  true,
	"PUT /v1/inventory/:sku": true,
}

// readBody reads the request's body, at most maxBody bytes, within the
// server's ReadTimeout (from the request's first byte: a deadline of our
// own set here would extend it past a client's slow headers). Once the body
// is in, it lifts the read deadline: the request timeout bounds the rest,
// and a deadline passing while the handler runs would cancel the request's
// context (net/http reports a failed read of the idle connection so). A
// failed read is 400 invalid_request.
func (s *Service) readBody(c echo.Context) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(c.Response().Writer, c.Request().Body, maxBody))
	if err != nil {
		return nil, bodyError(err)
	}
	// ErrNotSupported (a recorder in tests) leaves nothing to lift.
	_ = http.NewResponseController(c.Response().Writer).SetReadDeadline(time.Time{})
	return body, nil
}

// bodyError is the answer to a body that could not be read.
func bodyError(err error) error {
	var tooBig *http.MaxBytesError
	var netErr net.Error // the read deadline, a dropped connection
	switch {
	case errors.As(err, &tooBig):
		return invalid("body over %d KiB", maxBody>>10)
	case errors.As(err, &netErr) && netErr.Timeout():
		return invalid("body not received in time")
	default:
		return invalid("body not received whole")
	}
}
