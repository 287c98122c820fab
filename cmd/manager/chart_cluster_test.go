package main

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The chart's tests of what adapts it to a cluster and a platform team's
// conventions: its license, the gating policy's version, the election
// timings, namespaced mode, the test hook and the alerts' selectors.

// The chart, the image's labels (TestDockerfileMatchesImage and TestImage in
// test/install) and LICENSE name one license.
func TestChartLicense(t *testing.T) {
	license, err := os.ReadFile(filepath.Join("..", "..", "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(license), "Apache License\n                           Version 2.0, January 2004") ||
		!strings.Contains(string(license), "END OF TERMS AND CONDITIONS") {
		t.Fatalf("LICENSE is not the Apache License 2.0's full text: %.120q", license)
	}
	var chart struct{ Annotations map[string]string }
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatal(err)
	}
	if l := chart.Annotations["artifacthub.io/license"]; l != "Apache-2.0" {
		t.Errorf("Chart.yaml's artifacthub.io/license is %q, want Apache-2.0", l)
	}
	dockerfile, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), `org.opencontainers.image.licenses="Apache-2.0"`) {
		t.Error("the Dockerfile does not label the image Apache-2.0")
	}
}

// gatingVersion is the gating policy's apiVersion in a rendering, "none"
// without one; its binding must agree.
func gatingVersion(t *testing.T, r rendered) string {
	t.Helper()
	policy, binding := "none", "none"
	for _, obj := range r {
		switch obj.GetKind() {
		case "MutatingAdmissionPolicy":
			policy = obj.GetAPIVersion()
		case "MutatingAdmissionPolicyBinding":
			binding = obj.GetAPIVersion()
		}
	}
	if policy != binding {
		t.Errorf("the gating policy is %s, its binding %s", policy, binding)
	}
	return policy
}

// Rendered without a cluster, as a GitOps pipeline renders it, the gating
// policy follows --kube-version: none on 1.30 (no such API) and 1.34 (the
// beta is off by default), v1 on 1.36; a hint or the value overrides. With
// none, NOTES say why and what to do.
func TestChartMutatingPolicyVersionForKubeVersion(t *testing.T) {
	const (
		v1      = "admissionregistration.k8s.io/v1"
		v1beta1 = "admissionregistration.k8s.io/v1beta1"
	)
	for _, tc := range []struct {
		kube string
		args []string
		want string
	}{
		{"1.30.0", nil, "none"},
		{"1.34.0", nil, "none"},
		{"1.35.2", nil, "none"},
		{"1.36.0", nil, v1},
		{"1.37.1", nil, v1},
		{"1.34.0", []string{"--api-versions", "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"}, v1beta1},
		{"1.34.0", []string{"--set", "admission.mutatingPolicyVersion=v1beta1"}, v1beta1},
		{"1.36.0", []string{"--set", "admission.mutatingPolicyVersion=none"}, "none"},
		// A cluster's discovery names its kinds: v1/Pod without either
		// policy kind is a cluster that serves neither, whatever its version.
		{"1.36.0", []string{"--api-versions", "v1/Pod"}, "none"},
	} {
		r := renderChart(t, append([]string{"--kube-version", tc.kube}, tc.args...)...)
		if got := gatingVersion(t, r); got != tc.want {
			t.Errorf("--kube-version %s %v: the gating policy is %s, want %s", tc.kube, tc.args, got, tc.want)
		}
	}
	n := chartNotes(t, "--kube-version", "1.30.0")
	if !strings.Contains(n, "No gating policy is installed") || !strings.Contains(n, "Kubernetes v1.30.0") || !strings.Contains(n, "serves no") || !strings.Contains(n, "by hand") {
		t.Errorf("NOTES on 1.30 do not say the label gates nothing and why:\n%s", n)
	}
	if n := chartNotes(t, "--kube-version", "1.36.0"); strings.Contains(n, "No gating policy") {
		t.Errorf("NOTES on 1.36:\n%s", n)
	}
}

// The chart refuses the election timings the manager would refuse, and
// only those: the same table goes through both.
func TestChartElectionTimingsMatchTheManager(t *testing.T) {
	for _, tc := range []struct{ lease, renew, retry string }{
		{"15s", "10s", "2s"},
		{"15s", "15s", "2s"},
		{"15s", "20s", "2s"},
		{"15s", "10s", "9s"},
		{"15s", "10s", "8s"},
		{"1m30s", "1m", "500ms"},
		{"1m", "1m", "1s"},
		{"2h", "1.5h", "1h"},
		{"2s", "1500ms", "1250ms"},
	} {
		args := []string{"--set", "leaderElection.leaseDuration=" + tc.lease, "--set", "leaderElection.renewDeadline=" + tc.renew, "--set", "leaderElection.retryPeriod=" + tc.retry}
		manager := checkLeaderElection(mustDuration(t, tc.lease), mustDuration(t, tc.renew), mustDuration(t, tc.retry))
		if manager == nil {
			o := checkManagerArgs(t, renderChart(t, args...).deployment(t).Spec.Template.Spec.Containers[0].Args)
			if o.lease != mustDuration(t, tc.lease) {
				t.Errorf("%v: the manager got lease %v", tc, o.lease)
			}
			continue
		}
		out := chartFails(t, args...)
		want := "renewDeadline (" + tc.renew + ") must be below leaderElection.leaseDuration"
		if strings.Contains(manager.Error(), "retry-period") {
			want = "retryPeriod (" + tc.retry + ") times 1.2 must be below leaderElection.renewDeadline"
		}
		if !strings.Contains(out, want) {
			t.Errorf("%v: the manager says %q; the chart should say %q:\n%s", tc, manager, want, out)
		}
	}
	// Without leader election the timings are not used, nor checked.
	renderChart(t, "--set", "leaderElection.enable=false", "--set", "manager.replicas=1", "--set", "leaderElection.renewDeadline=1h")
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Namespaced mode: Roles and RoleBindings in each watched namespace, with
// the manager role's rules, and no cluster-wide grant of pods or locks to
// the manager; the manager watches those namespaces, and the gating policy
// gates only there.
func TestChartNamespaced(t *testing.T) {
	r := renderChart(t, "--set", "rbac.namespaced=true", "--set", "rbac.watchNamespaces={team-a,team-b}", "--set", "crd.keep=false")
	var managerRole rbacv1.ClusterRole
	strictFrom(t, decodeFile(t, filepath.Join(chartDir, "files", "rbac", "manager-role.yaml")), &managerRole)
	sa := "lockwarden-controller-manager"

	roles := map[string]bool{}
	clusterRoles := map[string]rbacv1.ClusterRole{}
	var clusterBindings []rbacv1.ClusterRoleBinding
	for _, obj := range r {
		switch obj.GetKind() {
		case "ClusterRole":
			var role rbacv1.ClusterRole
			strictFrom(t, obj, &role)
			clusterRoles[role.Name] = role
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			strictFrom(t, obj, &b)
			clusterBindings = append(clusterBindings, b)
		case "Role":
			var role rbacv1.Role
			strictFrom(t, obj, &role)
			if role.Name == "lockwarden-manager-role" {
				roles[role.Namespace] = true
				if !reflect.DeepEqual(role.Rules, managerRole.Rules) {
					t.Errorf("Role %s/%s's rules %v are not the manager role's %v", role.Namespace, role.Name, role.Rules, managerRole.Rules)
				}
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			strictFrom(t, obj, &b)
			if b.RoleRef.Name == "lockwarden-manager-role" {
				if b.RoleRef.Kind != "Role" || len(b.Subjects) != 1 || b.Subjects[0].Name != sa || b.Subjects[0].Namespace != "lockwarden-system" {
					t.Errorf("RoleBinding %s/%s: %+v %+v", b.Namespace, b.Name, b.RoleRef, b.Subjects)
				}
			}
		}
	}
	// Nothing cluster-wide grants the manager anything on pods or locks.
	for _, b := range clusterBindings {
		for _, subject := range b.Subjects {
			if subject.Name != sa {
				continue
			}
			for _, rule := range clusterRoles[b.RoleRef.Name].Rules {
				if slices.Contains(rule.Resources, "pods") || slices.Contains(rule.Resources, "distributedlocks") {
					t.Errorf("namespaced mode: ClusterRoleBinding %s grants the manager %v on %v cluster-wide", b.Name, rule.Verbs, rule.Resources)
				}
			}
		}
	}
	if _, ok := clusterRoles["lockwarden-manager-role"]; ok {
		t.Error("namespaced mode renders the manager's ClusterRole")
	}
	if !reflect.DeepEqual(roles, map[string]bool{"team-a": true, "team-b": true}) {
		t.Errorf("manager Roles in %v, want team-a and team-b", roles)
	}
	o := checkManagerArgs(t, r.deployment(t).Spec.Template.Spec.Containers[0].Args)
	if ns, _ := o.namespaces(); !slices.Equal(ns, []string{"team-a", "team-b"}) {
		t.Errorf("the manager watches %v", ns)
	}
	binding := r.find(t, "MutatingAdmissionPolicyBinding", "")
	values, _ := unstructuredSlice(binding.Object, "spec", "matchResources", "namespaceSelector", "matchExpressions")
	if want := fmt.Sprint([]any{map[string]any{"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{"team-a", "team-b"}}}); fmt.Sprint(values) != want {
		t.Errorf("the gating binding selects %v, want %s", values, want)
	}
	var test corev1.Pod
	strictFrom(t, r.find(t, "Pod", "lockwarden-test"), &test)
	if o := checkManagerArgs(t, test.Spec.Containers[0].Args); o.watchNamespaces != "team-a,team-b" || !o.check {
		t.Errorf("the test pod checks %v", test.Spec.Containers[0].Args)
	}

	// Cluster-wide by default: the ClusterRole, no Roles for it.
	def := renderChart(t)
	def.find(t, "ClusterRole", "lockwarden-manager-role")
	def.find(t, "ClusterRoleBinding", "lockwarden-manager-rolebinding")
	for _, obj := range def {
		if obj.GetKind() == "Role" && obj.GetName() == "lockwarden-manager-role" {
			t.Errorf("a Role %s/%s by default", obj.GetNamespace(), obj.GetName())
		}
	}
	if spec, _ := def.find(t, "MutatingAdmissionPolicyBinding", "").Object["spec"].(map[string]any); spec["matchResources"] != nil {
		t.Error("the gating binding is narrowed by default")
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "rbac.namespaced=true"}, "rbac.namespaced needs rbac.watchNamespaces"},
		{[]string{"--set", "rbac.watchNamespaces={team-a}"}, "rbac.namespaced is false"},
		{[]string{"--set", "rbac.namespaced=true", "--set", "rbac.watchNamespaces={a,a}"}, "names a namespace twice"},
		{[]string{"--set", "rbac.namespaced=true", "--set", "rbac.watchNamespaces={Team_A}"}, "watchNamespaces"},
		{[]string{"--set", "manager.extraArgs={--watch-namespaces=x}"}, "may not set --watch-namespaces"},
	} {
		if out := chartFails(t, tc.args...); !strings.Contains(out, tc.want) {
			t.Errorf("%v: %s", tc.args, out)
		}
	}
}

// unstructuredSlice is the list at the path in obj, and whether there is one.
func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[f]; !ok {
			return nil, false
		}
	}
	list, ok := cur.([]any)
	return list, ok
}

// helm test's pod runs `manager --check` with what the manager runs with:
// its image, ServiceAccount, Redis flags, environment and Secret files, in
// every Redis mode.
func TestChartTestHook(t *testing.T) {
	for _, values := range []string{
		`{}`,
		`{redis: {secretName: my-redis, mode: sentinel, sentinel: {addrs: ["s:26379"], masterName: m, username: su, passwordSecret: {name: sentinel-pw}}, tls: {enable: true, caSecret: {name: ca}}}}`,
		`{redis: {mode: cluster, cluster: {addrs: ["c:6379"]}, tls: {caSecret: {name: ca, key: bundle.pem}}}, serviceAccount: {name: custom}}`,
	} {
		r := renderChart(t, "-f", writeValues(t, values))
		deploy := r.deployment(t)
		var pod corev1.Pod
		strictFrom(t, r.find(t, "Pod", "lockwarden-test"), &pod)
		if pod.Annotations["helm.sh/hook"] != "test" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Fatalf("%s: the test pod is no test hook: %v %s", values, pod.Annotations, pod.Spec.RestartPolicy)
		}
		m, c := deploy.Spec.Template.Spec.Containers[0], pod.Spec.Containers[0]
		if c.Image != m.Image || pod.Spec.ServiceAccountName != deploy.Spec.Template.Spec.ServiceAccountName || c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("%s: test pod image %s, ServiceAccount %s, termination message %s; the manager's image %s, ServiceAccount %s",
				values, c.Image, pod.Spec.ServiceAccountName, c.TerminationMessagePolicy, m.Image, deploy.Spec.Template.Spec.ServiceAccountName)
		}
		check := checkManagerArgs(t, c.Args)
		manager := checkManagerArgs(t, m.Args)
		if !check.check || check.sentinels != manager.sentinels || !reflect.DeepEqual(check.redisCfg, manager.redisCfg) || check.cluster != manager.cluster {
			t.Errorf("%s: --check reaches Redis with %+v %q %q; the manager with %+v %q %q", values, check.redisCfg, check.sentinels, check.cluster, manager.redisCfg, manager.sentinels, manager.cluster)
		}
		if !reflect.DeepEqual(c.Env, m.Env) || !reflect.DeepEqual(c.EnvFrom, m.EnvFrom) ||
			!reflect.DeepEqual(mountedSecretFiles(pod.Spec, c), mountedSecretFiles(deploy.Spec.Template.Spec, m)) {
			t.Errorf("%s: the test pod's environment or Secret files differ from the manager's:\n%+v\n%+v\n%v\n%v", values, c.Env, m.Env,
				mountedSecretFiles(pod.Spec, c), mountedSecretFiles(deploy.Spec.Template.Spec, m))
		}
	}
}

// Every alert links its runbook, the section of docs/operating.md named
// after it; LockwardenManagerAbsent's absent() selects this install's
// series, and this cluster's when told how.
func TestAlertsRunbooksAndSelectors(t *testing.T) {
	type rules struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string
					Expr        string
					Annotations map[string]string
				}
			}
		}
	}
	check := func(what string, r rules, wantAbsent string) {
		t.Helper()
		n := 0
		for _, g := range r.Spec.Groups {
			for _, rule := range g.Rules {
				n++
				if want := "https://github.com/lockwarden/lockwarden/blob/main/docs/operating.md#" + strings.ToLower(rule.Alert); rule.Annotations["runbook_url"] != want {
					t.Errorf("%s: %s's runbook_url is %q, want %q", what, rule.Alert, rule.Annotations["runbook_url"], want)
				}
				if strings.Contains(rule.Expr, "absent(") && rule.Expr != wantAbsent {
					t.Errorf("%s: %s is %q, want %q", what, rule.Alert, rule.Expr, wantAbsent)
				}
			}
		}
		if n < 7 {
			t.Errorf("%s: %d alerts", what, n)
		}
	}
	var config rules
	strictYAML(t, filepath.Join("..", "..", "config", "alerts", "prometheusrule.yaml"), &config)
	check("config/alerts", config, `absent(lockwarden_redis_up{job="lockwarden-controller-manager-metrics-service",namespace="lockwarden-system"})`)

	for _, tc := range []struct {
		release string
		args    []string
		want    string
	}{
		{"lockwarden", nil, `absent(lockwarden_redis_up{job="lockwarden-controller-manager-metrics-service",namespace="lockwarden-system"})`},
		{"locks", []string{"--set", `metrics.prometheusRule.clusterSelector=cluster="prod-eu"\,region=~"eu-.*"`},
			`absent(lockwarden_redis_up{job="locks-lockwarden-controller-manager-metrics-service",namespace="lockwarden-system",cluster="prod-eu",region=~"eu-.*"})`},
	} {
		r := helmTemplateAs(t, tc.release, append([]string{"--set", "metrics.prometheusRule.enable=true"}, tc.args...)...)
		var chart rules
		for _, obj := range r {
			if obj.GetKind() == "PrometheusRule" {
				data, err := yaml.Marshal(obj.Object)
				if err != nil {
					t.Fatal(err)
				}
				if err := yaml.Unmarshal(data, &chart); err != nil {
					t.Fatal(err)
				}
			}
		}
		check("the chart as "+tc.release, chart, tc.want)
	}
	if out := chartFails(t, "--set", "metrics.prometheusRule.clusterSelector=cluster"); !strings.Contains(out, "clusterSelector") {
		t.Errorf("a selector that is not one: %s", out)
	}
}

func strictYAML(t *testing.T, file string, into any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		t.Fatal(err)
	}
}
