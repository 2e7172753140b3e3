package deploy_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const k8sDir = "k8s"

// manifests holds the decoded objects of deploy/k8s, by kind.
type manifests struct {
	deployments []appsv1.Deployment
	services    []corev1.Service
	configMaps  []corev1.ConfigMap
	pdbs        []policyv1.PodDisruptionBudget
	hpas        []autoscalingv2.HorizontalPodAutoscaler
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeManifests decodes every document of every file strictly into the
// official type for its apiVersion and kind: an unknown or misspelt field,
// a duplicate field or a kind this project does not ship is a problem.
func decodeManifests(files map[string]string) (manifests, []string) {
	var m manifests
	var problems []string
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for i, doc := range docSeparator.Split(files[name], -1) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				problems = append(problems, fmt.Sprintf("%s document %d: %v", name, i+1, err))
				continue
			}
			if meta.APIVersion == "" && meta.Kind == "" {
				continue // only comments
			}
			var err error
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				var obj appsv1.Deployment
				if err = yaml.UnmarshalStrict([]byte(doc), &obj); err == nil {
					m.deployments = append(m.deployments, obj)
				}
			case "v1 Service":
				var obj corev1.Service
				if err = yaml.UnmarshalStrict([]byte(doc), &obj); err == nil {
					m.services = append(m.services, obj)
				}
			case "v1 ConfigMap":
				var obj corev1.ConfigMap
				if err = yaml.UnmarshalStrict([]byte(doc), &obj); err == nil {
					m.configMaps = append(m.configMaps, obj)
				}
			case "policy/v1 PodDisruptionBudget":
				var obj policyv1.PodDisruptionBudget
				if err = yaml.UnmarshalStrict([]byte(doc), &obj); err == nil {
					m.pdbs = append(m.pdbs, obj)
				}
			case "autoscaling/v2 HorizontalPodAutoscaler":
				var obj autoscalingv2.HorizontalPodAutoscaler
				if err = yaml.UnmarshalStrict([]byte(doc), &obj); err == nil {
					m.hpas = append(m.hpas, obj)
				}
			default:
				err = fmt.Errorf("%s %s is not a kind this test knows", meta.APIVersion, meta.Kind)
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s document %d: %v", name, i+1, err))
			}
		}
	}
	return m, problems
}

// checkManifests returns every problem of the manifests in files.
func checkManifests(files map[string]string) []string {
	m, problems := decodeManifests(files)
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if len(m.deployments) != 1 {
		add("want one Deployment, found %d", len(m.deployments))
		return problems
	}
	d := m.deployments[0]
	pod := d.Spec.Template
	podLabels := labels.Set(pod.Labels)

	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		add("Deployment %s: selector does not match its pod labels", d.Name)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		add("Deployment %s: pod securityContext must set runAsNonRoot: true", d.Name)
	}
	configMaps := map[string]corev1.ConfigMap{}
	for _, cm := range m.configMaps {
		configMaps[cm.Name] = cm
		for key := range cm.Data {
			if !slices.Contains(designVars, key) {
				add("ConfigMap %s: key %s is not in docs/design.md's configuration table", cm.Name, key)
			}
		}
	}
	if len(pod.Spec.Containers) == 0 {
		add("Deployment %s: no container", d.Name)
	}
	for _, c := range pod.Spec.Containers {
		where := fmt.Sprintf("Deployment %s container %s", d.Name, c.Name)
		settings := map[string]string{} // what orderd is given, from the ConfigMap and env
		for _, src := range c.EnvFrom {
			if src.ConfigMapRef == nil {
				continue
			}
			cm, ok := configMaps[src.ConfigMapRef.Name]
			if !ok {
				add("%s: envFrom ConfigMap %q is not among the manifests", where, src.ConfigMapRef.Name)
			}
			for k, v := range cm.Data {
				settings[src.Prefix+k] = v
			}
		}
		for _, e := range c.Env {
			if !slices.Contains(designVars, e.Name) {
				add("%s: env %s is not in docs/design.md's configuration table", where, e.Name)
			}
			settings[e.Name] = e.Value
		}
		for key := range settings {
			if !slices.Contains(designVars, key) {
				add("%s: gets %s, which is not in docs/design.md's configuration table", where, key)
			}
		}
		if lock := settings["OVERSOLD_LOCK"]; !slices.Contains(designLocks, lock) {
			add("%s: OVERSOLD_LOCK=%q is not one of %v", where, lock, designLocks)
		}
		if guard := settings["OVERSOLD_GUARD"]; !slices.Contains(designGuards, guard) {
			add("%s: OVERSOLD_GUARD=%q is not one of %v", where, guard, designGuards)
		}
		if port, err := listenPort(settings["OVERSOLD_ADDR"]); err == nil && !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
			return fmt.Sprint(p.ContainerPort) == port
		}) {
			add("%s: OVERSOLD_ADDR port %s is not a container port", where, port)
		}
		for _, key := range serverVars {
			if v, ok := settings[key]; ok && v != "" {
				if _, err := serverHosts(key, v); err != nil {
					add("%s: %s: %v", where, key, err)
				}
			}
		}
		checkProbe(add, where+" readinessProbe", c.ReadinessProbe, readyPath, c)
		checkProbe(add, where+" livenessProbe", c.LivenessProbe, healthPath, c)
		if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
			add("%s: no cpu request, which the HPA's utilization target needs", where)
		}
	}

	for _, s := range m.services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			add("Service %s: selector does not match the pods of Deployment %s", s.Name, d.Name)
		}
		for _, p := range s.Spec.Ports {
			if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return hasPort(c, p.TargetPort) }) {
				add("Service %s: targetPort %s is no container port", s.Name, p.TargetPort.String())
			}
		}
	}
	if len(m.pdbs) == 0 {
		add("no PodDisruptionBudget")
	}
	for _, pdb := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || pdb.Spec.Selector == nil || sel.Empty() || !sel.Matches(podLabels) {
			add("PodDisruptionBudget %s: selector does not match the pods of Deployment %s", pdb.Name, d.Name)
		}
	}
	if len(m.hpas) == 0 {
		add("no HorizontalPodAutoscaler")
	}
	for _, h := range m.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
			add("HorizontalPodAutoscaler %s: targets %s %s %q, not Deployment %s", h.Name, ref.APIVersion, ref.Kind, ref.Name, d.Name)
		}
	}
	return problems
}

// checkProbe: an HTTP GET on path at a port the container declares.
func checkProbe(add func(string, ...any), where string, p *corev1.Probe, path string, c corev1.Container) {
	if p == nil || p.HTTPGet == nil {
		add("%s: want an httpGet probe on %s", where, path)
		return
	}
	if p.HTTPGet.Path != path {
		add("%s: path %q, want %s", where, p.HTTPGet.Path, path)
	}
	if !hasPort(c, p.HTTPGet.Port) {
		add("%s: port %s is no container port", where, p.HTTPGet.Port.String())
	}
}

// hasPort reports whether port (a name or a number) is one of c's ports.
func hasPort(c corev1.Container, port intstr.IntOrString) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		if port.Type == intstr.String {
			return p.Name != "" && p.Name == port.StrVal
		}
		return p.ContainerPort == port.IntVal
	})
}

func readManifests(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(k8sDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", k8sDir, err)
	}
	files := map[string]string{}
	for _, p := range paths {
		files[filepath.Base(p)] = readFile(t, p)
	}
	return files
}

// TestKubernetesManifests decodes deploy/k8s strictly into k8s.io/api types
// and checks that the objects fit together and match docs/design.md.
func TestKubernetesManifests(t *testing.T) {
	files := readManifests(t)
	for _, problem := range checkManifests(files) {
		t.Error(problem)
	}
	if t.Failed() {
		return
	}

	// Copies broken on purpose: each break must be reported.
	tests := []struct {
		name, file, old, new, want string
	}{
		{"misspelt field", "deployment.yaml", "  replicas: 3\n", "  replicas: 3\n  replcas: 3\n", `unknown field "replcas"`},
		{"duplicate field", "service.yaml", "  type: ClusterIP\n", "  type: ClusterIP\n  type: NodePort\n", `key "type" already set`},
		{"readiness on another route", "deployment.yaml", "path: /readyz", "path: /ready", `path "/ready", want /readyz`},
		{"liveness on readiness route", "deployment.yaml", "path: /healthz", "path: /readyz", `path "/readyz", want /healthz`},
		{"probe on an undeclared port", "deployment.yaml", "              port: http\n", "              port: metrics\n", "port metrics is no container port"},
		{"variable outside the table", "configmap.yaml", "  OVERSOLD_LOCK_WAIT: \"5s\"\n", "  OVERSOLD_LOCK_WAIT: \"5s\"\n  OVERSOLD_LOCK_TIMEOUT: \"5s\"\n", "key OVERSOLD_LOCK_TIMEOUT is not in docs/design.md"},
		{"unknown backend", "configmap.yaml", `OVERSOLD_LOCK: "redis"`, `OVERSOLD_LOCK: "consul"`, `OVERSOLD_LOCK="consul"`},
		{"bad etcd endpoint", "configmap.yaml", "http://etcd-0.etcd:2379", "grpc://etcd-0.etcd:2379", "want http:// or https://"},
		{"HPA on another target", "hpa.yaml", "    kind: Deployment\n    name: orderd\n", "    kind: Deployment\n    name: order\n", "HorizontalPodAutoscaler orderd: targets"},
		{"PDB selecting other pods", "pdb.yaml", "      app.kubernetes.io/component: orderd\n", "      app.kubernetes.io/component: lab\n", "PodDisruptionBudget orderd: selector"},
		{"Service selecting other pods", "service.yaml", "    app.kubernetes.io/component: orderd\n  ports", "    app.kubernetes.io/component: lab\n  ports", "Service orderd: selector"},
		{"root allowed", "deployment.yaml", "runAsNonRoot: true", "runAsNonRoot: false", "runAsNonRoot"},
		{"unknown kind", "pdb.yaml", "apiVersion: policy/v1", "apiVersion: policy/v1beta1", "not a kind this test knows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			broken := maps.Clone(files)
			broken[tt.file] = mustReplace(t, broken[tt.file], tt.old, tt.new)
			problems := checkManifests(broken)
			if !slices.ContainsFunc(problems, func(s string) bool { return strings.Contains(s, tt.want) }) {
				t.Errorf("want a problem containing %q, got:\n%s", tt.want, strings.Join(problems, "\n"))
			}
		})
	}

	// Files may hold several documents: a Deployment and its Service in one
	// file decode the same as in two.
	t.Run("multi-document file", func(t *testing.T) {
		joined := maps.Clone(files)
		joined["deployment.yaml"] += "\n---\n" + joined["service.yaml"]
		delete(joined, "service.yaml")
		if problems := checkManifests(joined); len(problems) > 0 {
			t.Errorf("joined files: %s", strings.Join(problems, "\n"))
		}
		m, _ := decodeManifests(joined)
		if len(m.deployments) != 1 || len(m.services) != 1 {
			t.Errorf("joined files: %d deployments and %d services, want 1 and 1", len(m.deployments), len(m.services))
		}
	})
}

// TestKubernetesReadmeFormats: the README documents the address formats the
// manifests use, and the example addresses in it parse as orderd expects.
func TestKubernetesReadmeFormats(t *testing.T) {
	readme := readFile(t, filepath.Join(k8sDir, "README.md"))
	for _, key := range serverVars {
		if !strings.Contains(readme, key) {
			t.Errorf("k8s/README.md does not document %s", key)
		}
	}
	// Examples are lines "KEY=value" inside code blocks.
	example := regexp.MustCompile(`(?m)^(OVERSOLD_[A-Z_]+)=(\S+)$`)
	found := map[string]bool{}
	for _, m := range example.FindAllStringSubmatch(readme, -1) {
		key, value := m[1], m[2]
		if !slices.Contains(designVars, key) {
			t.Errorf("k8s/README.md: %s is not in docs/design.md's configuration table", key)
			continue
		}
		if !slices.Contains(serverVars, key) {
			continue
		}
		found[key] = true
		if _, err := serverHosts(key, value); err != nil {
			t.Errorf("k8s/README.md example %s=%s: %v", key, value, err)
		}
	}
	for _, key := range serverVars {
		if !found[key] {
			t.Errorf("k8s/README.md has no KEY=value example for %s", key)
		}
	}
}
