package order

import (
	"context"
	"fmt"
	"math/rand/v2"
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
