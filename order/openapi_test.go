package order_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/oversold-lab/oversold/locking/local"
	"github.com/oversold-lab/oversold/order"
	"github.com/oversold-lab/oversold/storage"
)

// The checks below hold order/openapi.json to the real handler, both ways:
//
//   - loadDoc: the document is OpenAPI 3.0/3.1 shaped, every $ref resolves,
//     every schema uses only keywords validate understands, every example
//     fits its schema, and every error response lists its codes as examples
//     named by the code.
//   - checkRoutes: the document's operations are exactly echo's routes.
//   - checkExchange and checkCoverage: every answer of the real handler to a
//     table of requests is a documented status with its documented headers,
//     content type, body schema and error code; and every documented status
//     and error code is answered to some request of the table.
//
// Each check returns the problems it finds, and each also runs on broken
// copies that it must report.

// spec is the part of an OpenAPI 3 document the checks read.
type spec struct {
	OpenAPI string `json:"openapi"`
	Info    struct {
		Title   string `json:"title"`
		Version string `json:"version"`
	} `json:"info"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas         map[string]jsonSchema `json:"schemas"`
		Parameters      map[string]parameter  `json:"parameters"`
		Headers         map[string]header     `json:"headers"`
		Responses       map[string]response   `json:"responses"`
		SecuritySchemes map[string]struct {
			Type   string `json:"type"`
			Scheme string `json:"scheme"`
		} `json:"securitySchemes"`
	} `json:"components"`
}

type operation struct {
	OperationID string                `json:"operationId"`
	Parameters  []parameter           `json:"parameters"`
	RequestBody *requestBody          `json:"requestBody"`
	Responses   map[string]response   `json:"responses"`
	Security    []map[string][]string `json:"security"`
}

type parameter struct {
	Ref      string     `json:"$ref"`
	Name     string     `json:"name"`
	In       string     `json:"in"`
	Required bool       `json:"required"`
	Schema   jsonSchema `json:"schema"`
}

type requestBody struct {
	Required bool                 `json:"required"`
	Content  map[string]mediaType `json:"content"`
}

type response struct {
	Ref         string               `json:"$ref"`
	Description string               `json:"description"`
	Headers     map[string]header    `json:"headers"`
	Content     map[string]mediaType `json:"content"`
}

type header struct {
	Ref      string     `json:"$ref"`
	Required bool       `json:"required"`
	Schema   jsonSchema `json:"schema"`
}

type mediaType struct {
	Schema   jsonSchema      `json:"schema"`
	Example  json.RawMessage `json:"example"`
	Examples map[string]struct {
		Value json.RawMessage `json:"value"`
	} `json:"examples"`
}

// jsonSchema is a schema object as decoded (numbers are float64).
type jsonSchema map[string]any

// routeKey is one operation: "GET" and "/v1/orders/{id}".
type routeKey struct{ Method, Path string }

func (k routeKey) String() string { return k.Method + " " + k.Path }

// apiDoc is a loaded document: its operations with every $ref of
// parameters, responses and headers resolved.
type apiDoc struct {
	spec
	ops map[routeKey]*operation
}

var (
	httpMethods  = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
	openapiField = regexp.MustCompile(`^3\.[01]\.\d+$`)
	pathParam    = regexp.MustCompile(`\{([^{}/]+)\}`)
	uuidPattern  = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// schemaKeywords are the keywords validate enforces; annotations are the
// ones it may ignore. Any other keyword in the document is a problem: the
// check must not pass a rule it never looked at.
var (
	schemaKeywords = []string{"$ref", "type", "properties", "required", "additionalProperties", "enum", "pattern", "minimum", "maximum", "minLength", "maxLength", "format", "items", "minItems", "maxItems"}
	annotations    = []string{"description", "example", "title"}
	schemaTypes    = []string{"object", "string", "integer", "number", "boolean", "array"}
	formats        = []string{"uuid", "date-time"}
)

// loadDoc decodes an OpenAPI document and returns the problems of its shape.
func loadDoc(raw []byte) (*apiDoc, []string) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	d := &apiDoc{ops: map[routeKey]*operation{}}
	if err := json.Unmarshal(raw, &d.spec); err != nil {
		return nil, []string{"not an OpenAPI document: " + err.Error()}
	}
	if !openapiField.MatchString(d.OpenAPI) {
		add("openapi is %q, want 3.0.x or 3.1.x", d.OpenAPI)
	}
	if d.Info.Title == "" || d.Info.Version == "" {
		add("info needs a title and a version")
	}
	if len(d.Paths) == 0 {
		add("no paths")
	}
	for _, name := range slices.Sorted(maps.Keys(d.Components.Schemas)) {
		problems = append(problems, d.checkSchema(d.Components.Schemas[name], "components.schemas."+name)...)
	}
	ids := map[string]routeKey{}
	for _, path := range slices.Sorted(maps.Keys(d.Paths)) {
		if !strings.HasPrefix(path, "/") {
			add("path %q does not start with /", path)
		}
		item := d.Paths[path]
		for _, key := range slices.Sorted(maps.Keys(item)) {
			if key == "summary" || key == "description" {
				continue
			}
			if !slices.Contains(httpMethods, key) {
				add("%s: %q is not an HTTP method, and path-level fields other than summary and description are not checked", path, key)
				continue
			}
			k := routeKey{strings.ToUpper(key), path}
			var op operation
			if err := json.Unmarshal(item[key], &op); err != nil {
				add("%s: %v", k, err)
				continue
			}
			if op.OperationID == "" {
				add("%s: no operationId", k)
			} else if other, dup := ids[op.OperationID]; dup {
				add("%s and %s share operationId %q", other, k, op.OperationID)
			}
			ids[op.OperationID] = k
			problems = append(problems, d.resolve(k, &op)...)
			d.ops[k] = &op
		}
	}
	problems = append(problems, d.checkErrorCodes()...)
	return d, problems
}

// resolve replaces op's $refs with what they name and checks the operation.
func (d *apiDoc) resolve(k routeKey, op *operation) []string {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, k.String()+": "+fmt.Sprintf(format, args...))
	}
	declared := map[string]bool{}
	for i, p := range op.Parameters {
		if p.Ref != "" {
			name, ok := strings.CutPrefix(p.Ref, "#/components/parameters/")
			if p, ok = d.Components.Parameters[name]; !ok {
				add("unresolved %s", op.Parameters[i].Ref)
				continue
			}
			op.Parameters[i] = p
		}
		switch {
		case p.Name == "" || !slices.Contains([]string{"path", "header", "query"}, p.In):
			add("parameter %q in %q: want a name, and in path, header or query", p.Name, p.In)
		case p.Schema == nil:
			add("parameter %s has no schema", p.Name)
		case p.In == "path":
			declared[p.Name] = true
			if !p.Required {
				add("path parameter %s must be required", p.Name)
			}
		}
		problems = append(problems, d.checkSchema(p.Schema, k.String()+" parameter "+p.Name)...)
	}
	for _, m := range pathParam.FindAllStringSubmatch(k.Path, -1) {
		if !declared[m[1]] {
			add("path parameter {%s} is not declared", m[1])
		}
		delete(declared, m[1])
	}
	for name := range declared {
		add("parameter %s is declared in path but the path has no {%s}", name, name)
	}
	if b := op.RequestBody; b != nil {
		if len(b.Content) == 0 {
			add("requestBody without content")
		}
		for mt, m := range b.Content {
			problems = append(problems, d.checkMedia(m, k.String()+" requestBody "+mt)...)
		}
	}
	for _, req := range op.Security {
		for name := range req {
			if _, ok := d.Components.SecuritySchemes[name]; !ok {
				add("security scheme %q is not in components.securitySchemes", name)
			}
		}
	}
	if len(op.Responses) == 0 {
		add("no responses")
	}
	for status, r := range op.Responses {
		at := k.String() + " " + status
		if n, err := strconv.Atoi(status); err != nil || n < 100 || n > 599 {
			add("response %q: want an exact status, 100 to 599", status)
		}
		if r.Ref != "" {
			name, ok := strings.CutPrefix(r.Ref, "#/components/responses/")
			if r, ok = d.Components.Responses[name]; !ok {
				add("unresolved %s", op.Responses[status].Ref)
				continue
			}
		}
		if r.Description == "" {
			add("response %s has no description", status)
		}
		hs := map[string]header{}
		for name, h := range r.Headers {
			if h.Ref != "" {
				ref, ok := strings.CutPrefix(h.Ref, "#/components/headers/")
				if h, ok = d.Components.Headers[ref]; !ok {
					add("response %s: unresolved %s", status, r.Headers[name].Ref)
					continue
				}
			}
			problems = append(problems, d.checkSchema(h.Schema, at+" header "+name)...)
			hs[name] = h
		}
		r.Headers = hs
		for mt, m := range r.Content {
			problems = append(problems, d.checkMedia(m, at+" "+mt)...)
			if n, _ := strconv.Atoi(status); n >= 400 {
				if len(m.Examples) == 0 {
					add("error response %s lists no error code (one example per code, named by it)", status)
				}
				for name, ex := range m.Examples {
					if code := errorCodeOf(ex.Value); code != name {
						add("error response %s: example %q holds code %q, want the example named by its code", status, name, code)
					}
				}
			}
		}
		op.Responses[status] = r
	}
	return problems
}

// checkMedia checks a media type's schema and that its examples fit it.
func (d *apiDoc) checkMedia(m mediaType, at string) []string {
	if m.Schema == nil {
		return []string{at + ": no schema"}
	}
	problems := d.checkSchema(m.Schema, at)
	if m.Example != nil {
		problems = append(problems, d.validateJSON(m.Schema, m.Example, at+" example")...)
	}
	for name, ex := range m.Examples {
		problems = append(problems, d.validateJSON(m.Schema, ex.Value, at+" example "+name)...)
	}
	return problems
}

// checkSchema refuses keywords validate does not know, unresolved $refs
// and malformed constraints, and validates a schema's own example.
func (d *apiDoc) checkSchema(s jsonSchema, at string) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, at+": "+fmt.Sprintf(format, args...)) }
	for key, v := range s {
		switch {
		case slices.Contains(annotations, key):
		case !slices.Contains(schemaKeywords, key):
			add("keyword %q is not checked by this test: teach validate or drop it", key)
		case key == "$ref":
			if len(s) > 1 {
				add("$ref with siblings (OpenAPI 3.0 ignores them)")
			}
			if _, err := d.schemaRef(v); err != nil {
				add("%v", err)
			}
		case key == "type":
			if !slices.Contains(schemaTypes, fmt.Sprint(v)) {
				add("type %v", v)
			}
		case key == "format":
			if t := s["type"]; t == "string" && !slices.Contains(formats, fmt.Sprint(v)) {
				add("string format %v is not checked", v)
			}
		case key == "pattern":
			if _, err := regexp.Compile(fmt.Sprint(v)); err != nil {
				add("pattern: %v", err)
			}
		case key == "properties":
			props, _ := v.(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(props)) {
				sub, _ := props[name].(map[string]any)
				problems = append(problems, d.checkSchema(sub, at+"."+name)...)
			}
		case key == "required":
			props, _ := s["properties"].(map[string]any)
			list, ok := v.([]any)
			if !ok {
				add("required is not a list")
			}
			for _, name := range list {
				if _, ok := props[fmt.Sprint(name)]; !ok {
					add("required %v is not a property", name)
				}
			}
		case key == "items":
			sub, _ := v.(map[string]any)
			problems = append(problems, d.checkSchema(sub, at+"[]")...)
		case key == "additionalProperties":
			if _, ok := v.(bool); !ok {
				add("additionalProperties: only true or false are checked")
			}
		}
	}
	if ex, ok := s["example"]; ok {
		raw, _ := json.Marshal(ex)
		problems = append(problems, d.validateJSON(s, raw, at+" example")...)
	}
	return problems
}

func (d *apiDoc) schemaRef(ref any) (jsonSchema, error) {
	name, ok := strings.CutPrefix(fmt.Sprint(ref), "#/components/schemas/")
	s, found := d.Components.Schemas[name]
	if !ok || !found {
		return nil, fmt.Errorf("unresolved $ref %v", ref)
	}
	return s, nil
}

// checkErrorCodes: the ErrorCode enum is exactly the codes the error
// responses list.
func (d *apiDoc) checkErrorCodes() []string {
	s, ok := d.Components.Schemas["ErrorCode"]
	enum, _ := s["enum"].([]any)
	if !ok || len(enum) == 0 {
		return []string{"components.schemas.ErrorCode: want the enum of error codes"}
	}
	used := map[string]bool{}
	for _, op := range d.ops {
		for _, r := range op.Responses {
			for _, m := range r.Content {
				for name := range m.Examples {
					used[name] = true
				}
			}
		}
	}
	var problems []string
	for _, c := range enum {
		if !used[fmt.Sprint(c)] {
			problems = append(problems, fmt.Sprintf("ErrorCode %v: no response lists it", c))
		}
	}
	return problems
}

// validateJSON validates raw JSON against s.
func (d *apiDoc) validateJSON(s jsonSchema, raw []byte, at string) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("%s: not JSON: %v", at, err)}
	}
	if dec.More() {
		return []string{at + ": trailing data after the JSON value"}
	}
	return d.validate(s, v, at)
}

// validate checks v (decoded with UseNumber) against s, for the keywords of
// schemaKeywords.
func (d *apiDoc) validate(s jsonSchema, v any, at string) []string {
	if ref, ok := s["$ref"]; ok {
		t, err := d.schemaRef(ref)
		if err != nil {
			return []string{at + ": " + err.Error()}
		}
		return d.validate(t, v, at)
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, at+": "+fmt.Sprintf(format, args...)) }
	if t, ok := s["type"]; ok && !hasType(v, fmt.Sprint(t)) {
		bad("%s is not of type %v", show(v), t)
		return problems
	}
	if enum, ok := s["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return show(e) == show(v) }) {
		bad("%s is not one of %s", show(v), show(enum))
	}
	switch v := v.(type) {
	case string:
		if p, ok := s["pattern"]; ok && !regexp.MustCompile(fmt.Sprint(p)).MatchString(v) {
			bad("%q does not match %v", v, p)
		}
		n := float64(utf8.RuneCountInString(v))
		if lo, ok := s["minLength"].(float64); ok && n < lo {
			bad("%q is shorter than %v", v, lo)
		}
		if hi, ok := s["maxLength"].(float64); ok && n > hi {
			bad("%.40q... is longer than %v", v, hi)
		}
		switch s["format"] {
		case "uuid":
			if !uuidPattern.MatchString(v) {
				bad("%q is not a uuid", v)
			}
		case "date-time":
			if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
				bad("%q is not a date-time: %v", v, err)
			}
		}
	case json.Number:
		f, _ := v.Float64()
		if lo, ok := s["minimum"].(float64); ok && f < lo {
			bad("%s is below %v", v, lo)
		}
		if hi, ok := s["maximum"].(float64); ok && f > hi {
			bad("%s is above %v", v, hi)
		}
	case []any:
		n := float64(len(v))
		if lo, ok := s["minItems"].(float64); ok && n < lo {
			bad("%d items, fewer than %v", len(v), lo)
		}
		if hi, ok := s["maxItems"].(float64); ok && n > hi {
			bad("%d items, more than %v", len(v), hi)
		}
		if items, ok := s["items"].(map[string]any); ok {
			for i, e := range v {
				problems = append(problems, d.validate(items, e, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for _, name := range s.required() {
			if _, ok := v[name]; !ok {
				bad("missing %q", name)
			}
		}
		for _, name := range slices.Sorted(maps.Keys(v)) {
			sub, ok := props[name].(map[string]any)
			if !ok {
				if s["additionalProperties"] == false {
					bad("unknown field %q", name)
				}
				continue
			}
			problems = append(problems, d.validate(sub, v[name], at+"."+name)...)
		}
	}
	return problems
}

func (s jsonSchema) required() []string {
	var out []string
	list, _ := s["required"].([]any)
	for _, r := range list {
		out = append(out, fmt.Sprint(r))
	}
	return out
}

func hasType(v any, t string) bool {
	switch v := v.(type) {
	case map[string]any:
		return t == "object"
	case []any:
		return t == "array"
	case string:
		return t == "string"
	case bool:
		return t == "boolean"
	case json.Number:
		if t == "number" {
			return true
		}
		// An integer literal: "1.0", "1e3" are numbers the API refuses.
		_, errI := strconv.ParseInt(v.String(), 10, 64)
		_, errU := strconv.ParseUint(v.String(), 10, 64)
		return t == "integer" && (errI == nil || errU == nil)
	}
	return false
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func errorCodeOf(raw []byte) string {
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(raw, &body)
	return body.Error.Code
}

// handlerRoutes lists the routes of echo, in the document's notation
// (":id" is "{id}"), leaving out echo's internal route-not-found entries.
func handlerRoutes(e *echo.Echo) []routeKey {
	var out []routeKey
	for _, r := range e.Routes() {
		if r.Method == echo.RouteNotFound {
			continue
		}
		segs := strings.Split(r.Path, "/")
		for i, s := range segs {
			if name, ok := strings.CutPrefix(s, ":"); ok {
				segs[i] = "{" + name + "}"
			}
		}
		out = append(out, routeKey{r.Method, strings.Join(segs, "/")})
	}
	return out
}

// checkRoutes: the document's operations are exactly the handler's routes.
func checkRoutes(d *apiDoc, routes []routeKey) []string {
	var problems []string
	served := map[routeKey]bool{}
	for _, r := range routes {
		served[r] = true
		if d.ops[r] == nil {
			problems = append(problems, fmt.Sprintf("%s is served but not in the document", r))
		}
	}
	for k := range d.ops {
		if !served[k] {
			problems = append(problems, fmt.Sprintf("%s is in the document but not served", k))
		}
	}
	slices.Sort(problems)
	return problems
}

// match finds the operation for a request: a literal path segment matches
// itself, {name} any one non-empty segment; the most literal template wins.
func (d *apiDoc) match(method, path string) (routeKey, map[string]string, bool) {
	got := strings.Split(path, "/")
	var best routeKey
	var bestParams map[string]string
	bestLiterals := -1
	for k := range d.ops {
		tmpl := strings.Split(k.Path, "/")
		if k.Method != method || len(tmpl) != len(got) {
			continue
		}
		params, literals := map[string]string{}, 0
		for i, seg := range tmpl {
			if m := pathParam.FindStringSubmatch(seg); m != nil && m[0] == seg && got[i] != "" {
				params[m[1]] = got[i]
			} else if seg == got[i] {
				literals++
			} else {
				params = nil
				break
			}
		}
		if params != nil && literals > bestLiterals {
			best, bestParams, bestLiterals = k, params, literals
		}
	}
	return best, bestParams, bestLiterals >= 0
}

// exchange is one request of the table and the real handler's answer.
type exchange struct {
	name string
	req  *http.Request
	body string
	rec  *httptest.ResponseRecorder
	// refused: the document's request rules (parameter and body schemas,
	// content types) must refuse this request too.
	refused bool
}

// observation is one answer, in the document's terms.
type observation struct {
	op     routeKey
	status int
	code   string
}

// checkExchange checks one answer against the document: a documented
// status with its required headers, content type, body schema and error
// code. The request must fit the document's rules when it succeeded, and
// break them when it is marked refused. ok is false for a request no
// operation takes (echo's own 404 and 405).
func checkExchange(d *apiDoc, ex exchange) (obs observation, ok bool, problems []string) {
	add := func(format string, args ...any) {
		problems = append(problems, ex.name+": "+fmt.Sprintf(format, args...))
	}
	rec := ex.rec
	key, params, found := d.match(ex.req.Method, ex.req.URL.Path)
	if !found {
		// Outside every route: the error envelope, 404 or 405.
		if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
			add("%s %s matches no operation, but was answered %d", ex.req.Method, ex.req.URL.Path, rec.Code)
		}
		problems = append(problems, d.validateJSON(jsonSchema{"$ref": "#/components/schemas/Error"}, rec.Body.Bytes(), ex.name+" body")...)
		return observation{}, false, problems
	}
	op := d.ops[key]
	obs = observation{op: key, status: rec.Code}

	// The request against the document's rules.
	var broken []string
	for _, p := range op.Parameters {
		var v string
		present := false
		switch p.In {
		case "path":
			v, present = params[p.Name], true
		case "header":
			v = ex.req.Header.Get(p.Name)
			present = v != ""
		case "query":
			present = ex.req.URL.Query().Has(p.Name)
			v = ex.req.URL.Query().Get(p.Name)
		}
		if !present {
			if p.Required {
				broken = append(broken, "missing parameter "+p.Name)
			}
			continue
		}
		broken = append(broken, d.validate(p.Schema, scalar(p.Schema, v), "parameter "+p.Name)...)
	}
	if b := op.RequestBody; b != nil {
		mt, _, _ := mime.ParseMediaType(ex.req.Header.Get("Content-Type"))
		m, ok := b.Content[mt]
		switch {
		case ex.body == "" && b.Required:
			broken = append(broken, "no body")
		case !ok:
			broken = append(broken, fmt.Sprintf("Content-Type %q is not one of the request's", mt))
		default:
			broken = append(broken, d.validateJSON(m.Schema, []byte(ex.body), "request body")...)
		}
	}
	switch {
	case ex.refused && len(broken) == 0:
		add("the handler refused it (%d), but the document's request rules accept it", rec.Code)
	case rec.Code < 300 && len(broken) > 0:
		add("the handler accepted it (%d), but the document refuses it: %s", rec.Code, strings.Join(broken, "; "))
	}

	// The answer against the document.
	r, listed := op.Responses[strconv.Itoa(rec.Code)]
	if !listed {
		add("%s answered %d (%s), which the document does not list", key, rec.Code, strings.TrimSpace(rec.Body.String()))
		return obs, true, problems
	}
	for name, h := range r.Headers {
		v := rec.Header().Get(name)
		if v == "" {
			if h.Required {
				add("%s %d: no %s header", key, rec.Code, name)
			}
			continue
		}
		problems = append(problems, d.validate(h.Schema, scalar(h.Schema, v), ex.name+" header "+name)...)
	}
	if len(r.Content) == 0 {
		if rec.Body.Len() > 0 {
			add("%s %d: a body, where the document has none", key, rec.Code)
		}
		return obs, true, problems
	}
	ct := rec.Header().Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	m, ok := r.Content[mt]
	if !ok {
		add("%s %d: Content-Type %q, the document has %v", key, rec.Code, ct, slices.Sorted(maps.Keys(r.Content)))
		return obs, true, problems
	}
	if mt == echo.MIMEApplicationJSON {
		problems = append(problems, d.validateJSON(m.Schema, rec.Body.Bytes(), ex.name+" body")...)
	}
	if rec.Code >= 400 {
		obs.code = errorCodeOf(rec.Body.Bytes())
		if _, ok := m.Examples[obs.code]; !ok {
			add("%s %d: error code %q is not among the response's codes %v", key, rec.Code, obs.code, slices.Sorted(maps.Keys(m.Examples)))
		}
	}
	return obs, true, problems
}

// scalar turns a parameter or header value into the JSON value its schema
// wants: a number for integers, else the string.
func scalar(s jsonSchema, v string) any {
	if t := s["type"]; t == "integer" || t == "number" {
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			return json.Number(v)
		}
	}
	return v
}

// checkCoverage: every documented status of every operation, and every
// error code of every error response, was answered to some request.
func checkCoverage(d *apiDoc, seen []observation) []string {
	type key struct {
		op     routeKey
		status string
		code   string
	}
	got := map[key]bool{}
	for _, o := range seen {
		s := strconv.Itoa(o.status)
		got[key{o.op, s, ""}] = true
		got[key{o.op, s, o.code}] = true
	}
	var problems []string
	for k, op := range d.ops {
		for status, r := range op.Responses {
			if !got[key{k, status, ""}] {
				problems = append(problems, fmt.Sprintf("%s %s is documented, but no request of the table was answered with it", k, status))
				continue
			}
			for _, m := range r.Content {
				for code := range m.Examples {
					if !got[key{k, status, code}] {
						problems = append(problems, fmt.Sprintf("%s %s %s is documented, but no request of the table was answered with it", k, status, code))
					}
				}
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// broken returns a copy of the raw document changed by edit.
func broken(t *testing.T, raw []byte, edit func(doc map[string]any)) []byte {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	edit(doc)
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dig walks a decoded document: dig(doc, "paths", "/healthz", "get").
func dig(v any, keys ...string) map[string]any {
	for _, k := range keys {
		v = v.(map[string]any)[k]
	}
	return v.(map[string]any)
}

func mustLoad(t *testing.T, raw []byte) *apiDoc {
	t.Helper()
	d, problems := loadDoc(raw)
	if d == nil {
		t.Fatal(problems)
	}
	return d
}

func echoOf(t *testing.T, h http.Handler) *echo.Echo {
	t.Helper()
	e, ok := h.(*echo.Echo)
	if !ok {
		t.Fatalf("Service.Handler() is a %T, not the *echo.Echo this test walks the routes of", h)
	}
	return e
}

// TestOpenAPIDocument: the served document is order/openapi.json, is
// OpenAPI 3 shaped, and documents exactly the handler's routes. No servers
// needed: a Service only builds its routes.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	h := order.New(nil, nil, nil, order.Config{}).Handler()
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	rec := call(h, http.MethodGet, "/openapi.json", "")
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != echo.MIMEApplicationJSON || !bytes.Equal(rec.Body.Bytes(), file) {
		t.Fatalf("GET /openapi.json = %d %q, %d bytes; want 200 application/json and openapi.json's %d bytes",
			rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len(), len(file))
	}
	raw := rec.Body.Bytes()
	if !json.Valid(raw) {
		t.Fatal("openapi.json is not JSON")
	}

	t.Run("shape", func(t *testing.T) {
		d, problems := loadDoc(raw)
		for _, p := range problems {
			t.Error(p)
		}
		if d != nil && len(d.ops) == 0 {
			t.Error("no operations")
		}
	})

	routes := handlerRoutes(echoOf(t, h))
	t.Run("routes", func(t *testing.T) {
		for _, p := range checkRoutes(mustLoad(t, raw), routes) {
			t.Error(p)
		}
	})

	// Each check reports a broken copy.
	for _, c := range []struct {
		name   string
		doc    []byte
		routes []routeKey
		check  func(d *apiDoc, problems []string, routes []routeKey) []string
		want   string
	}{
		{name: "Swagger 2", doc: broken(t, raw, func(doc map[string]any) { doc["openapi"] = "2.0" }), want: `openapi is "2.0"`},
		{name: "no info", doc: broken(t, raw, func(doc map[string]any) { delete(doc, "info") }), want: "info needs"},
		{name: "unresolved ref", doc: broken(t, raw, func(doc map[string]any) {
			dig(doc, "components", "schemas", "OrderRequest", "properties")["sku"] = map[string]any{"$ref": "#/components/schemas/Nope"}
		}), want: "unresolved $ref"},
		{name: "unchecked keyword", doc: broken(t, raw, func(doc map[string]any) {
			dig(doc, "components", "schemas", "Quantity")["multipleOf"] = 2
		}), want: `keyword "multipleOf"`},
		{name: "example off its schema", doc: broken(t, raw, func(doc map[string]any) {
			dig(doc, "components", "schemas", "Inventory", "example")["stock"] = -1
		}), want: "below 0"},
		{name: "undeclared path parameter", doc: broken(t, raw, func(doc map[string]any) {
			dig(doc, "paths", "/v1/orders/{id}", "get")["parameters"] = []any{}
		}), want: "{id} is not declared"},
		{name: "error response without codes", doc: broken(t, raw, func(doc map[string]any) {
			delete(dig(doc, "paths", "/v1/orders/{id}", "get", "responses", "404", "content", "application/json"), "examples")
		}), want: "lists no error code"},
		{name: "code no response lists", doc: broken(t, raw, func(doc map[string]any) {
			s := dig(doc, "components", "schemas", "ErrorCode")
			s["enum"] = append(s["enum"].([]any), "teapot")
		}), want: "ErrorCode teapot"},
		{name: "route without docs", doc: raw, routes: append(slices.Clone(routes), routeKey{"DELETE", "/v1/orders/{id}"}),
			want: "DELETE /v1/orders/{id} is served but not in the document"},
		{name: "docs without route", doc: broken(t, raw, func(doc map[string]any) {
			dig(doc, "paths", "/healthz")["post"] = dig(doc, "paths", "/healthz", "get")
		}), routes: routes, want: "POST /healthz is in the document but not served"},
		{name: "route missing from docs", doc: broken(t, raw, func(doc map[string]any) { delete(dig(doc, "paths"), "/metrics") }), routes: routes,
			want: "GET /metrics is served but not in the document"},
	} {
		t.Run("refuses "+c.name, func(t *testing.T) {
			d, problems := loadDoc(c.doc)
			if c.routes != nil {
				problems = checkRoutes(d, c.routes)
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("no problem mentions %q; got %q", c.want, problems)
			}
		})
	}
}

// downStore is MySQL failing mid-request, for the reads and writes of the
// GET and PUT routes.
type downStore struct{ order.Store }

var errDown = errors.New("mysql: connection refused")

func (downStore) Order(context.Context, string) (storage.Order, error) {
	return storage.Order{}, errDown
}
func (downStore) Inventory(context.Context, string) (storage.Inventory, error) {
	return storage.Inventory{}, errDown
}
func (downStore) PutInventory(context.Context, storage.Put) (storage.Inventory, error) {
	return storage.Inventory{}, errDown
}

func (downStore) Reservation(context.Context, string) (storage.Reservation, error) {
	return storage.Reservation{}, errDown
}

// conflictStore is a version guard that refuses every reservation write,
// and MySQL choosing every stock reset as a deadlock's victim.
type conflictStore struct{ order.Store }

func (conflictStore) PutInventory(context.Context, storage.Put) (storage.Inventory, error) {
	return storage.Inventory{}, storage.ErrConflict
}

func (conflictStore) Hold(context.Context, storage.Guard, storage.Reservation, time.Duration, []storage.Move) (storage.Reservation, []storage.Inventory, error) {
	return storage.Reservation{}, nil, storage.ErrConflict
}
func (conflictStore) Settle(context.Context, storage.Guard, storage.Settlement, []storage.Move) (storage.Reservation, []storage.Inventory, error) {
	return storage.Reservation{}, nil, storage.ErrConflict
}

// TestOpenAPIStatuses sends a table of requests to the real handler on real
// MariaDB and Redis (with fault doubles where a status needs a failure) and
// holds every answer to the document, and the document to the answers:
// every documented status and error code of every operation must come up.
func TestOpenAPIStatuses(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	doc := mustLoad(t, file)
	f := newFixture(t)
	ctx := t.Context()
	admin := order.Config{Lock: "local", AdminToken: adminToken}

	// The replicas: one healthy, and one per failure.
	h := f.service(local.New(), admin).Handler()
	f.stock("widget", 10)

	held := local.New()
	f.stock("held", 5)
	lease, err := held.Acquire(ctx, "sku/held")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Release(context.Background()) })
	timeout := f.service(held, order.Config{Lock: "local", LockWait: 50 * time.Millisecond, AdminToken: adminToken}).Handler()

	gone := make(chan struct{})
	close(gone)
	f.stock("lost", 5)
	lost := f.service(lostLocker{local.New(), gone}, order.Config{Lock: "local", AdminToken: adminToken}).Handler()

	f.stock("stale", 5)
	stale := f.serviceWith(f.openStore(), func(c order.Cache) order.Cache { return staleCache{c} }, local.New(), order.Config{Lock: "local"}).Handler()

	// Accept queue: a replica that queues and does not consume (not
	// started), so its order stays pending; and a rejected order.
	g := f.gate()
	queue := f.service(nil, order.Config{Guard: storage.GuardAtomic, Gate: g, Queue: g.Queue()}).Handler()
	rejected := "0190a5c8-0000-7000-8000-0000000000aa"
	if _, err := f.store.RejectQueued(ctx, storage.QueuedOrder{ID: rejected, SKU: "widget", Quantity: 1, Reason: "out_of_stock",
		Instance: "r1", Lock: "none", CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}

	f.stock("down", 5)
	lockDown := f.service(downLocker{}, order.Config{Lock: "redis"}).Handler()
	mysqlDown := f.serviceWith(downStore{f.openStore()}, nil, nil, admin).Handler()
	conflicting := f.serviceWith(conflictStore{f.openStore()}, nil, local.New(), admin).Handler()

	// Reservations in each state the table needs, held by the healthy
	// replica: {res-NAME} in a path is the id of the one named NAME.
	healthy := f.service(local.New(), admin)
	res := map[string]string{}
	for _, r := range []struct {
		name, sku string
		ttl       int64
		then      func(context.Context, string) (order.Reservation, error)
	}{
		{"expired", "widget", 1, nil},
		{"confirmed", "widget", 0, healthy.Confirm},
		{"cancelled", "widget", 0, healthy.Cancel},
		{"lost", "lost", 0, nil},
		{"held", "held", 0, nil},
		{"open", "widget", 0, nil},
		{"open2", "widget", 0, nil},
	} {
		got, _, err := healthy.Hold(ctx, order.HoldRequest{Lines: []order.Line{{SKU: r.sku, Quantity: 1}}, TTLSeconds: r.ttl})
		if err == nil && r.then != nil {
			_, err = r.then(ctx, got.ID)
		}
		if err != nil {
			t.Fatalf("reservation %s: %v", r.name, err)
		}
		res[r.name] = got.ID
	}
	time.Sleep(1100 * time.Millisecond) // past the expired one's expires_at

	type row struct {
		name         string
		h            http.Handler
		method, path string
		body         string
		header       []string // name, value, ...
		status       int
		code         string
		refused      bool
	}
	auth := []string{"Authorization", "Bearer " + adminToken}
	order1 := `{"sku":"widget","quantity":1}`
	hold1 := `{"lines":[{"sku":"widget","quantity":1}]}`
	rows := []row{
		{name: "valid order", h: h, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", "k-1"}, status: 201},
		{name: "replay", h: h, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", "k-1"}, status: 200},
		{name: "out of stock", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":1000}`, status: 409, code: "out_of_stock"},
		{name: "quantity 0", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":0}`, status: 400, code: "invalid_request", refused: true},
		{name: "quantity 1001", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":1001}`, status: 400, code: "invalid_request", refused: true},
		{name: "fractional quantity", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":1.0}`, status: 400, code: "invalid_request", refused: true},
		{name: "string quantity", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":"1"}`, status: 400, code: "invalid_request", refused: true},
		{name: "spaced sku", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"a b","quantity":1}`, status: 400, code: "invalid_request", refused: true},
		{name: "65-byte sku", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"` + strings.Repeat("a", 65) + `","quantity":1}`, status: 400, code: "invalid_request", refused: true},
		{name: "unknown field", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":1,"price":0}`, status: 400, code: "invalid_request", refused: true},
		{name: "missing quantity", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget"}`, status: 400, code: "invalid_request", refused: true},
		{name: "malformed JSON", h: h, method: "POST", path: "/v1/orders", body: `{"sku":`, status: 400, code: "invalid_request", refused: true},
		{name: "text/plain order", h: h, method: "POST", path: "/v1/orders", body: order1, header: []string{"Content-Type", "text/plain"}, status: 400, code: "invalid_request", refused: true},
		{name: "256-byte key", h: h, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", strings.Repeat("k", 256)}, status: 400, code: "invalid_request", refused: true},
		{name: "unknown sku", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"nope","quantity":1}`, status: 404, code: "unknown_sku"},
		{name: "reused key", h: h, method: "POST", path: "/v1/orders", body: `{"sku":"widget","quantity":2}`, header: []string{"Idempotency-Key", "k-1"}, status: 422, code: "idempotency_key_reused"},
		{name: "lock lost", h: lost, method: "POST", path: "/v1/orders", body: `{"sku":"lost","quantity":1}`, status: 409, code: "lock_lost"},
		{name: "version conflict", h: stale, method: "POST", path: "/v1/orders", body: `{"sku":"stale","quantity":1}`, status: 409, code: "conflict"},
		{name: "lock timeout", h: timeout, method: "POST", path: "/v1/orders", body: `{"sku":"held","quantity":1}`, status: 503, code: "lock_timeout"},
		{name: "lock backend down", h: lockDown, method: "POST", path: "/v1/orders", body: `{"sku":"down","quantity":1}`, status: 503, code: "unavailable"},

		{name: "queued order", h: queue, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", "q-1"}, status: 202},
		{name: "queued replay", h: queue, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", "q-1"}, status: 200},
		{name: "GET order", h: h, method: "GET", path: "/v1/orders/{placed}", status: 200},
		{name: "GET pending order", h: queue, method: "GET", path: "/v1/orders/{queued}", status: 200},
		{name: "GET rejected order", h: queue, method: "GET", path: "/v1/orders/" + rejected, status: 200},
		{name: "GET unknown order", h: h, method: "GET", path: "/v1/orders/0190a5c8-0000-7000-8000-000000000000", status: 404, code: "not_found"},
		{name: "GET malformed order id", h: h, method: "GET", path: "/v1/orders/x'%20OR%201=1--", status: 404, code: "not_found", refused: true},
		{name: "GET order, MySQL down", h: mysqlDown, method: "GET", path: "/v1/orders/0190a5c8-0000-7000-8000-000000000000", status: 503, code: "unavailable"},

		{name: "GET inventory", h: h, method: "GET", path: "/v1/inventory/widget", status: 200},
		{name: "GET unknown inventory", h: h, method: "GET", path: "/v1/inventory/nope", status: 404, code: "unknown_sku"},
		{name: "GET SQL-like inventory", h: h, method: "GET", path: "/v1/inventory/x'%20OR%201=1--", status: 404, code: "unknown_sku", refused: true},
		{name: "GET inventory, MySQL down", h: mysqlDown, method: "GET", path: "/v1/inventory/widget", status: 503, code: "unavailable"},

		{name: "PUT inventory", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: auth, status: 200},
		{name: "PUT new inventory", h: h, method: "PUT", path: "/v1/inventory/gadget.2", body: `{"stock":0}`, header: auth, status: 200},
		{name: "PUT missing token", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, status: 401, code: "unauthorized"},
		{name: "PUT wrong token", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: []string{"Authorization", "Bearer nope"}, status: 401, code: "unauthorized"},
		{name: "PUT negative stock", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":-1}`, header: auth, status: 400, code: "invalid_request", refused: true},
		{name: "PUT stock over 1e9", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":1000000001}`, header: auth, status: 400, code: "invalid_request", refused: true},
		{name: "PUT unknown field", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5,"version":9}`, header: auth, status: 400, code: "invalid_request", refused: true},
		{name: "PUT SQL-like sku", h: h, method: "PUT", path: "/v1/inventory/x'%20OR%201=1--", body: `{"stock":5}`, header: auth, status: 400, code: "invalid_request", refused: true},
		{name: "PUT if another version", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: append([]string{"If-Match", `"999"`}, auth...), status: 412, code: "precondition_failed"},
		{name: "PUT if-match not a version", h: h, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: append([]string{"If-Match", "*"}, auth...), status: 400, code: "invalid_request", refused: true},
		{name: "PUT, lock lost", h: lost, method: "PUT", path: "/v1/inventory/lost", body: `{"stock":50}`, header: auth, status: 409, code: "lock_lost"},
		{name: "PUT, conflict", h: conflicting, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: auth, status: 409, code: "conflict"},
		{name: "PUT, lock timeout", h: timeout, method: "PUT", path: "/v1/inventory/held", body: `{"stock":50}`, header: auth, status: 503, code: "lock_timeout"},
		{name: "PUT, MySQL down", h: mysqlDown, method: "PUT", path: "/v1/inventory/widget", body: `{"stock":5}`, header: auth, status: 503, code: "unavailable"},

		{name: "hold", h: h, method: "POST", path: "/v1/reservations", body: hold1, header: []string{"Idempotency-Key", "r-1"}, status: 201},
		{name: "hold replay", h: h, method: "POST", path: "/v1/reservations", body: hold1, header: []string{"Idempotency-Key", "r-1"}, status: 200},
		{name: "hold reused key", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"widget","quantity":2}]}`, header: []string{"Idempotency-Key", "r-1"}, status: 422, code: "idempotency_key_reused"},
		{name: "hold under an order's key", h: h, method: "POST", path: "/v1/reservations", body: hold1, header: []string{"Idempotency-Key", "k-1"}, status: 422, code: "idempotency_key_reused"},
		{name: "order under a hold's key", h: h, method: "POST", path: "/v1/orders", body: order1, header: []string{"Idempotency-Key", "r-1"}, status: 422, code: "idempotency_key_reused"},
		{name: "hold out of stock", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"widget","quantity":1000}]}`, status: 409, code: "out_of_stock"},
		{name: "hold unknown sku", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"widget","quantity":1},{"sku":"nope","quantity":1}]}`, status: 404, code: "unknown_sku"},
		{name: "hold no lines", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[]}`, status: 400, code: "invalid_request", refused: true},
		{name: "hold ttl 0", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"widget","quantity":1}],"ttl_seconds":0}`, status: 400, code: "invalid_request", refused: true},
		{name: "hold line field", h: h, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"widget","quantity":1,"price":1}]}`, status: 400, code: "invalid_request", refused: true},
		{name: "hold, lock lost", h: lost, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"lost","quantity":1}]}`, status: 409, code: "lock_lost"},
		{name: "hold, conflict", h: conflicting, method: "POST", path: "/v1/reservations", body: hold1, status: 409, code: "conflict"},
		{name: "hold, lock timeout", h: timeout, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"held","quantity":1}]}`, status: 503, code: "lock_timeout"},
		{name: "hold, lock backend down", h: lockDown, method: "POST", path: "/v1/reservations", body: `{"lines":[{"sku":"down","quantity":1}]}`, status: 503, code: "unavailable"},
		{name: "GET reservation", h: h, method: "GET", path: "/v1/reservations/{res-open}", status: 200},
		{name: "GET unknown reservation", h: h, method: "GET", path: "/v1/reservations/0190a5c8-0000-7000-8000-000000000000", status: 404, code: "not_found"},
		{name: "GET reservation, MySQL down", h: mysqlDown, method: "GET", path: "/v1/reservations/{res-open}", status: 503, code: "unavailable"},
		{name: "confirm", h: h, method: "POST", path: "/v1/reservations/{res-open}/confirm", status: 200},
		{name: "confirm unknown", h: h, method: "POST", path: "/v1/reservations/0190a5c8-0000-7000-8000-000000000000/confirm", status: 404, code: "not_found"},
		{name: "confirm expired", h: h, method: "POST", path: "/v1/reservations/{res-expired}/confirm", status: 409, code: "reservation_expired"},
		{name: "confirm cancelled", h: h, method: "POST", path: "/v1/reservations/{res-cancelled}/confirm", status: 409, code: "reservation_cancelled"},
		{name: "confirm, conflict", h: conflicting, method: "POST", path: "/v1/reservations/{res-open2}/confirm", status: 409, code: "conflict"},
		{name: "confirm, lock lost", h: lost, method: "POST", path: "/v1/reservations/{res-lost}/confirm", status: 409, code: "lock_lost"},
		{name: "confirm, lock timeout", h: timeout, method: "POST", path: "/v1/reservations/{res-held}/confirm", status: 503, code: "lock_timeout"},
		{name: "confirm, lock backend down", h: lockDown, method: "POST", path: "/v1/reservations/{res-open2}/confirm", status: 503, code: "unavailable"},
		{name: "cancel", h: h, method: "POST", path: "/v1/reservations/{res-open2}/cancel", status: 200},
		{name: "cancel unknown", h: h, method: "POST", path: "/v1/reservations/x/cancel", status: 404, code: "not_found", refused: true},
		{name: "cancel confirmed", h: h, method: "POST", path: "/v1/reservations/{res-confirmed}/cancel", status: 409, code: "reservation_confirmed"},
		{name: "cancel expired", h: h, method: "POST", path: "/v1/reservations/{res-expired}/cancel", status: 409, code: "reservation_expired"},
		{name: "cancel, conflict", h: conflicting, method: "POST", path: "/v1/reservations/{res-lost}/cancel", status: 409, code: "conflict"},
		{name: "cancel, lock lost", h: lost, method: "POST", path: "/v1/reservations/{res-lost}/cancel", status: 409, code: "lock_lost"},
		{name: "cancel, lock timeout", h: timeout, method: "POST", path: "/v1/reservations/{res-held}/cancel", status: 503, code: "lock_timeout"},
		{name: "cancel, MySQL down", h: mysqlDown, method: "POST", path: "/v1/reservations/{res-held}/cancel", status: 503, code: "unavailable"},

		{name: "healthz", h: h, method: "GET", path: "/healthz", status: 200},
		{name: "readyz", h: h, method: "GET", path: "/readyz", status: 200},
		{name: "readyz, lock backend down", h: lockDown, method: "GET", path: "/readyz", status: 503, code: "unavailable"},
		{name: "metrics", h: h, method: "GET", path: "/metrics", status: 200},
		{name: "openapi.json", h: h, method: "GET", path: "/openapi.json", status: 200},

		{name: "no route", h: h, method: "GET", path: "/v2/nothing", status: 404, code: "not_found"},
		{name: "wrong method", h: h, method: "DELETE", path: "/v1/orders", status: 405, code: "invalid_request"},
	}

	var (
		exchanges []exchange
		seen      []observation
		placed    string
		queued    string
	)
	for _, r := range rows {
		path := strings.ReplaceAll(strings.ReplaceAll(r.path, "{placed}", placed), "{queued}", queued)
		for name, id := range res {
			path = strings.ReplaceAll(path, "{res-"+name+"}", id)
		}
		req := httptest.NewRequest(r.method, path, strings.NewReader(r.body))
		if r.body != "" {
			req.Header.Set("Content-Type", echo.MIMEApplicationJSON)
		}
		for i := 0; i+1 < len(r.header); i += 2 {
			req.Header.Set(r.header[i], r.header[i+1])
		}
		rec := httptest.NewRecorder()
		r.h.ServeHTTP(rec, req)
		if rec.Code == http.StatusCreated && r.path == "/v1/orders" {
			placed = decodeOrder(t, rec).ID
		}
		if rec.Code == http.StatusAccepted {
			queued = decodeOrder(t, rec).ID
		}
		if code := errorCodeOf(rec.Body.Bytes()); rec.Code != r.status || code != r.code {
			t.Errorf("%s: %s %s = %d %q (%s), want %d %q", r.name, r.method, path, rec.Code, code, strings.TrimSpace(rec.Body.String()), r.status, r.code)
		}
		ex := exchange{name: r.name, req: req, body: r.body, rec: rec, refused: r.refused}
		exchanges = append(exchanges, ex)
		obs, ok, problems := checkExchange(doc, ex)
		for _, p := range problems {
			t.Error(p)
		}
		if ok {
			seen = append(seen, obs)
		}
	}
	for _, p := range checkCoverage(doc, seen) {
		t.Error(p)
	}

	// The checks report a document that drifted from the handler.
	for _, c := range []struct {
		name string
		edit func(doc map[string]any)
		want string
	}{
		{"a status nothing answers", func(doc map[string]any) {
			dig(doc, "paths", "/healthz", "get", "responses")["418"] = map[string]any{"description": "teapot"}
		}, "GET /healthz 418 is documented, but no request"},
		{"an error code nothing answers", func(doc map[string]any) {
			ex := dig(doc, "paths", "/v1/orders/{id}", "get", "responses", "404", "content", "application/json", "examples")
			ex["unknown_sku"] = map[string]any{"value": map[string]any{"error": map[string]any{"code": "unknown_sku", "message": "x"}}}
		}, "GET /v1/orders/{id} 404 unknown_sku is documented, but no request"},
		{"an answered status left out", func(doc map[string]any) {
			delete(dig(doc, "paths", "/v1/orders", "post", "responses"), "409")
		}, "POST /v1/orders answered 409"},
		{"an answered error code left out", func(doc map[string]any) {
			delete(dig(doc, "paths", "/v1/orders", "post", "responses", "409", "content", "application/json", "examples"), "lock_lost")
		}, `error code "lock_lost" is not among`},
		{"a header that is not sent", func(doc map[string]any) {
			dig(doc, "paths", "/readyz", "get", "responses", "200")["headers"] = map[string]any{"Retry-After": map[string]any{"$ref": "#/components/headers/RetryAfter"}}
		}, "GET /readyz 200: no Retry-After header"},
		{"a body schema looser than the handler", func(doc map[string]any) {
			dig(doc, "components", "schemas", "Quantity")["maximum"] = 5000
		}, "quantity 1001: the handler refused it (400), but the document's request rules accept it"},
		{"a body schema stricter than the handler", func(doc map[string]any) {
			dig(doc, "components", "schemas", "Stock")["minimum"] = 1
		}, "PUT new inventory: the handler accepted it (200), but the document refuses it"},
		{"an order field left out", func(doc map[string]any) {
			delete(dig(doc, "components", "schemas", "Order", "properties"), "token")
			s := dig(doc, "components", "schemas", "Order")
			s["required"] = slices.DeleteFunc(s["required"].([]any), func(v any) bool { return v == "token" })
			delete(dig(doc, "components", "schemas", "Order", "example"), "token")
		}, `unknown field "token"`},
	} {
		t.Run("refuses "+c.name, func(t *testing.T) {
			d := mustLoad(t, broken(t, file, c.edit))
			var problems []string
			var seen []observation
			for _, ex := range exchanges {
				obs, ok, ps := checkExchange(d, ex)
				problems = append(problems, ps...)
				if ok {
					seen = append(seen, obs)
				}
			}
			problems = append(problems, checkCoverage(d, seen)...)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("no problem mentions %q; got %q", c.want, problems)
			}
		})
	}
}
