package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/oversold-lab/oversold/storage"
)

// postReservation: POST /v1/reservations {"lines":[{"sku","quantity"}],
// "ttl_seconds"?}, optional Idempotency-Key.
func (s *Service) postReservation(c echo.Context) error {
	req, err := parseHold(c)
	if err == nil {
		var r Reservation
		var replayed bool
		if r, replayed, err = s.Hold(c.Request().Context(), req); err == nil {
			c.Response().Header().Set("Location", "/v1/reservations/"+r.ID)
			if replayed {
				s.metrics.reservations.WithLabelValues("hold", "replayed").Inc()
				return c.JSON(http.StatusOK, r)
			}
			s.metrics.reservations.WithLabelValues("hold", "held").Inc()
			s.log.Info("reservation held", "reservation_id", r.ID, "lines", len(r.Lines))
			return c.JSON(http.StatusCreated, r)
		}
	}
	_, _, _, outcome := classify(err)
	s.metrics.reservations.WithLabelValues("hold", outcome).Inc()
	return err
}

// parseHold reads a hold request. A line is exactly {"sku","quantity"};
// lines are 1 to maxLines, each SKU at most once.
func parseHold(c echo.Context) (HoldRequest, error) {
	var req HoldRequest
	var err error
	if req.Key, err = idempotencyKey(c); err != nil {
		return req, err
	}
	obj, err := readFields(c, []string{"lines"}, []string{"ttl_seconds"})
	if err != nil {
		return req, err
	}
	if _, ok := obj["ttl_seconds"]; ok {
		if req.TTLSeconds, err = intField(obj, "ttl_seconds", 1, maxTTLSeconds); err != nil {
			return req, err
		}
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(obj["lines"], &raw); err != nil || len(raw) < 1 || len(raw) > maxLines {
		return req, invalid("lines must be an array of 1 to %d lines", maxLines)
	}
	seen := map[string]bool{}
	for i, r := range raw {
		line, err := members(r, fmt.Sprintf("lines[%d]: ", i))
		if errors.Is(err, errNotObject) {
			return req, invalid("lines[%d] must be an object {\"sku\", \"quantity\"}", i)
		}
		if err != nil {
			return req, err
		}
		if err := checkFields(line, []string{"sku", "quantity"}, nil); err != nil {
			return req, fmt.Errorf("lines[%d]: %w", i, err)
		}
		var l Line
		if l.SKU, err = skuField(line["sku"]); err != nil {
			return req, fmt.Errorf("lines[%d]: %w", i, err)
		}
		if l.Quantity, err = intField(line, "quantity", 1, maxQuantity); err != nil {
			return req, fmt.Errorf("lines[%d]: %w", i, err)
		}
		if seen[l.SKU] {
			return req, invalid("lines[%d]: sku %q is in the lines twice", i, l.SKU)
		}
		seen[l.SKU] = true
		req.Lines = append(req.Lines, l)
	}
	return req, nil
}

// reservationID is the id in the path; only the canonical spelling of a
// UUID can exist.
func reservationID(c echo.Context) (string, error) {
	id := c.Param("id")
	if u, err := uuid.Parse(id); err != nil || u.String() != id {
		return "", fmt.Errorf("reservation %q: %w", id, storage.ErrNoReservation)
	}
	return id, nil
}

// getReservation: GET /v1/reservations/{id}.
func (s *Service) getReservation(c echo.Context) error {
	id, err := reservationID(c)
	if err != nil {
		return err
	}
	r, err := s.GetReservation(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

// confirmReservation: POST /v1/reservations/{id}/confirm.
func (s *Service) confirmReservation(c echo.Context) error {
	return s.settleRoute(c, s.Confirm)
}

// cancelReservation: POST /v1/reservations/{id}/cancel.
func (s *Service) cancelReservation(c echo.Context) error {
	return s.settleRoute(c, s.Cancel)
}

func (s *Service) settleRoute(c echo.Context, settle func(ctx context.Context, id string) (Reservation, error)) error {
	id, err := reservationID(c)
	if err != nil {
		return err
	}
	r, err := settle(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}
