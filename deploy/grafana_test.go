package deploy_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// orderdMetrics are the series orderd exports (order/metrics.go) with their
// labels: the table in deploy/README.md. orderd names the replica in the
// label replica; instance is left to Prometheus.
var orderdMetrics = map[string][]string{
	"oversold_orders_total":               {"outcome", "lock", "guard", "replica"},
	"oversold_lock_wait_seconds":          {"lock", "replica"},
	"oversold_lock_hold_seconds":          {"lock", "replica"},
	"oversold_lock_renewals_failed_total": {"lock", "replica"},
	"oversold_lock_leases_lost_total":     {"lock", "replica"},
	"oversold_guard_conflicts_total":      {"guard", "replica"},
	"oversold_reservations_total":         {"op", "outcome", "replica"},
	"oversold_stock_reserved":             {"replica"},
	"oversold_sweep_lag_seconds":          {"replica"},
}

var (
	metricName = regexp.MustCompile(`\boversold_[a-z_]+`)
	byClause   = regexp.MustCompile(`\b(?:by|without) \(([^)]*)\)`)
	selector   = regexp.MustCompile(`\boversold_[a-z_]+\{([^}]*)\}`)
	matchLabel = regexp.MustCompile(`(\w+)\s*(?:=~|!~|!=|=)`)
)

// Labels on every series besides orderd's own: Prometheus' target labels,
// and le on histogram buckets.
var scrapeLabels = []string{"job", "instance", "le"}

// checkDashboard: the dashboard is valid JSON, every panel uses the
// provisioned data source, it graphs every metric of orderdMetrics and no
// metric orderd does not export.
func checkDashboard(dashboard, datasources string) []string {
	var problems []string
	var ds struct {
		Datasources []struct {
			UID  string `json:"uid"`
			Type string `json:"type"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal([]byte(datasources), &ds); err != nil || len(ds.Datasources) == 0 {
		return []string{fmt.Sprintf("datasource provisioning: none found (%v)", err)}
	}
	uid := ds.Datasources[0].UID

	type target struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	}
	type panel struct {
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []target `json:"targets"`
	}
	var dash struct {
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboard), &dash); err != nil {
		return []string{"dashboard: " + err.Error()}
	}
	if dash.UID == "" {
		problems = append(problems, "dashboard: no uid (links to it would break on every reload)")
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != uid {
			problems = append(problems, fmt.Sprintf("panel %q: data source %q, want the provisioned %q", p.Title, p.Datasource.UID, uid))
		}
		for _, t := range p.Targets {
			if t.Datasource.UID != uid {
				problems = append(problems, fmt.Sprintf("panel %q: query data source %q, want %q", p.Title, t.Datasource.UID, uid))
			}
			known := slices.Clone(scrapeLabels) // the labels this query can use
			names := metricName.FindAllString(t.Expr, -1)
			for _, name := range names {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
				labels, ok := orderdMetrics[base]
				if !ok {
					problems = append(problems, fmt.Sprintf("panel %q: %s is not a metric orderd exports", p.Title, name))
				}
				known = append(known, labels...)
				used[base] = true
			}
			if len(names) == 0 {
				continue // up{...} and the like: Prometheus' own series
			}
			var labels []string
			for _, m := range byClause.FindAllStringSubmatch(t.Expr, -1) {
				labels = append(labels, strings.Split(m[1], ",")...)
			}
			for _, m := range selector.FindAllStringSubmatch(t.Expr, -1) {
				for _, l := range matchLabel.FindAllStringSubmatch(m[1], -1) {
					labels = append(labels, l[1])
				}
			}
			for _, l := range labels {
				if l = strings.TrimSpace(l); !slices.Contains(known, l) {
					problems = append(problems, fmt.Sprintf("panel %q: label %s is not on %v", p.Title, l, names))
				}
			}
		}
	}
	for name := range orderdMetrics {
		if !used[name] {
			problems = append(problems, fmt.Sprintf("dashboard: no panel shows %s", name))
		}
	}
	slices.Sort(problems)
	return problems
}

// TestGrafanaDashboard checks the provisioned dashboard, and that the
// README's metric table names the same metrics and labels.
func TestGrafanaDashboard(t *testing.T) {
	dashboard := readFile(t, filepath.Join("grafana", "dashboards", "oversold.json"))
	datasources := readFile(t, filepath.Join("grafana", "provisioning", "datasources", "prometheus.yml"))
	for _, problem := range checkDashboard(dashboard, datasources) {
		t.Error(problem)
	}

	readme := readFile(t, "README.md")
	for name, labels := range orderdMetrics {
		row := regexp.MustCompile("(?m)^\\| `" + name + "` \\|.*$").FindString(readme)
		if row == "" {
			t.Errorf("README.md: no row for %s in the metric table", name)
			continue
		}
		for _, l := range labels {
			if !strings.Contains(row, "`"+l+"`") {
				t.Errorf("README.md: the row of %s does not name label %s", name, l)
			}
		}
	}

	// Broken copies are reported.
	t.Run("misspelt metric", func(t *testing.T) {
		broken := mustReplace(t, dashboard, "oversold_lock_leases_lost_total", "oversold_lock_lease_lost_total")
		problems := strings.Join(checkDashboard(broken, datasources), "\n")
		for _, want := range []string{"oversold_lock_lease_lost_total is not a metric", "no panel shows oversold_lock_leases_lost_total"} {
			if !strings.Contains(problems, want) {
				t.Errorf("want %q, got:\n%s", want, problems)
			}
		}
	})
	t.Run("label the metric lacks", func(t *testing.T) {
		broken := mustReplace(t, dashboard, "sum by (guard, replica)", "sum by (guard, lock)")
		problems := strings.Join(checkDashboard(broken, datasources), "\n")
		if want := "label lock is not on [oversold_guard_conflicts_total]"; !strings.Contains(problems, want) {
			t.Errorf("want %q, got:\n%s", want, problems)
		}
	})
	t.Run("other data source", func(t *testing.T) {
		broken := mustReplace(t, datasources, "uid: prometheus", "uid: prom")
		if problems := checkDashboard(dashboard, broken); len(problems) == 0 {
			t.Error("a dashboard whose data source uid is not provisioned passed")
		}
	})
}
