package order

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3 description of Handler's API: every route, its
// bodies, its statuses and, per status, its error codes. openapi_test.go
// holds it to the real handler both ways: what it lists is what the handler
// serves and answers, and the reverse.
//
//go:embed openapi.json
var openAPI []byte

// serveOpenAPI: GET /openapi.json.
func serveOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}
