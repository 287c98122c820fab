package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The chart's tests below render it with one group of values each and
// check the objects they reach, as TestChartValues does; the manager must
// accept the flags and environment it gets.

// rendered is a rendering of the chart, by kind and name.
type rendered []*unstructured.Unstructured

func (r rendered) find(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range r {
		if obj.GetKind() == kind && (name == "" || obj.GetName() == name) {
			return obj
		}
	}
	t.Fatalf("the chart renders no %s %s", kind, name)
	return nil
}

func (r rendered) has(kind string) bool {
	return slices.ContainsFunc(r, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind })
}

func (r rendered) deployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	strictFrom(t, r.find(t, "Deployment", ""), &d)
	return &d
}

func renderChart(t *testing.T, args ...string) rendered {
	t.Helper()
	return helmTemplate(t, args...)
}

// chartFails renders the chart with args and returns helm's error output,
// failing the test if helm renders it.
func chartFails(t *testing.T, args ...string) string {
	t.Helper()
	return chartFailsAs(t, "lockwarden", args...)
}

func chartFailsAs(t *testing.T, release string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join("..", "..", "bin", "helm"),
		append([]string{"template", release, chartDir, "--namespace", "lockwarden-system", "--kube-version", kubeVersion}, args...)...)
	home := t.TempDir()
	cmd.Env = []string{"HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home, "HELM_DATA_HOME=" + home}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("helm template %v rendered; want it refused", args)
	}
	return string(out)
}

func TestChartImage(t *testing.T) {
	var chart struct{ AppVersion string }
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q (%v)", chart.AppVersion, err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		args       []string
		image      string
		pullPolicy corev1.PullPolicy
	}{
		{nil, "ghcr.io/lockwarden/manager:" + chart.AppVersion, ""},
		{[]string{"--set", "manager.image.repository=registry.example/lw", "--set", "manager.image.tag=v9.9.9"}, "registry.example/lw:v9.9.9", ""},
		{[]string{"--set", "manager.image.digest=" + digest}, "ghcr.io/lockwarden/manager:" + chart.AppVersion + "@" + digest, ""},
		{[]string{"--set", "manager.image.pullPolicy=Always"}, "ghcr.io/lockwarden/manager:" + chart.AppVersion, corev1.PullAlways},
	} {
		r := renderChart(t, append(tc.args, "--set", "crd.keep=false")...)
		c := r.deployment(t).Spec.Template.Spec.Containers[0]
		var hook batchv1.Job
		strictFrom(t, r.find(t, "Job", ""), &hook)
		hc := hook.Spec.Template.Spec.Containers[0]
		if c.Image != tc.image || c.ImagePullPolicy != tc.pullPolicy || hc.Image != tc.image || hc.ImagePullPolicy != tc.pullPolicy {
			t.Errorf("%v: manager image %s (%s), hook image %s (%s); want %s (%q)", tc.args, c.Image, c.ImagePullPolicy, hc.Image, hc.ImagePullPolicy, tc.image, tc.pullPolicy)
		}
	}
	if out := chartFails(t, "--set", "manager.image.digest=latest"); !strings.Contains(out, "digest") {
		t.Errorf("a digest that is not one: %s", out)
	}
}

// Pull secrets, placement, priority, pod labels and annotations, and the
// ServiceAccount's settings reach the manager pods, and the uninstall
// hook's where they apply.
func TestChartPlacement(t *testing.T) {
	values := `
imagePullSecrets: [{name: regcred}]
manager:
  priorityClassName: lockwarden-critical
  nodeSelector: {kubernetes.io/os: linux, pool: system}
  tolerations: [{key: dedicated, operator: Equal, value: system, effect: NoSchedule}]
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
  - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {custom: "yes"}}}
  podLabels: {team: platform}
  podAnnotations: {example.com/scrape: "false"}
serviceAccount:
  annotations: {iam.example.com/role: lockwarden}
crd: {keep: false}
`
	r := renderChart(t, "--values", writeValues(t, values))
	d := r.deployment(t)
	pod := d.Spec.Template.Spec
	if !reflect.DeepEqual(pod.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}}) || pod.PriorityClassName != "lockwarden-critical" ||
		pod.NodeSelector["pool"] != "system" || len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "dedicated" {
		t.Errorf("placement not applied: %+v", pod)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	if podLabels["team"] != "platform" || d.Spec.Template.Annotations["example.com/scrape"] != "false" {
		t.Errorf("pod labels %v, annotations %v", d.Spec.Template.Labels, d.Spec.Template.Annotations)
	}
	if !selects(t, d.Spec.Selector, podLabels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector, podLabels)
	}
	if tsc := pod.TopologySpreadConstraints; len(tsc) != 2 || !selects(t, tsc[0].LabelSelector, podLabels) || tsc[1].LabelSelector.MatchLabels["custom"] != "yes" {
		t.Errorf("topology spread: %+v (the first should select the manager pods, the second keep its own selector)", tsc)
	}
	// Without an affinity of its own, the manager prefers one replica per
	// node; with one, that one replaces it.
	if pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil {
		t.Errorf("no default anti-affinity: %+v", pod.Affinity)
	}
	r2 := renderChart(t, "--values", writeValues(t, `manager: {affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [system]}]}]}}}}`))
	if a := r2.deployment(t).Spec.Template.Spec.Affinity; a.NodeAffinity == nil || a.PodAntiAffinity != nil {
		t.Errorf("manager.affinity did not replace the default: %+v", a)
	}

	var sa corev1.ServiceAccount
	strictFrom(t, r.find(t, "ServiceAccount", "lockwarden-controller-manager"), &sa)
	if sa.Annotations["iam.example.com/role"] != "lockwarden" {
		t.Errorf("ServiceAccount annotations %v", sa.Annotations)
	}
	var hook batchv1.Job
	strictFrom(t, r.find(t, "Job", ""), &hook)
	hp := hook.Spec.Template.Spec
	if !reflect.DeepEqual(hp.ImagePullSecrets, pod.ImagePullSecrets) || !reflect.DeepEqual(hp.NodeSelector, pod.NodeSelector) ||
		!reflect.DeepEqual(hp.Tolerations, pod.Tolerations) || hp.PriorityClassName != pod.PriorityClassName {
		t.Errorf("the uninstall hook's pod is not placed as the manager's: %+v", hp)
	}

	// An existing ServiceAccount: none rendered, every binding names it, and
	// so does the admission policy that recognises the manager.
	r3 := renderChart(t, "--set", "serviceAccount.create=false", "--set", "serviceAccount.name=platform-lockwarden")
	if r3.has("ServiceAccount") {
		t.Error("serviceAccount.create=false still renders a ServiceAccount")
	}
	if got := r3.deployment(t).Spec.Template.Spec.ServiceAccountName; got != "platform-lockwarden" {
		t.Errorf("serviceAccountName %s", got)
	}
	checkSubjects(t, r3, "platform-lockwarden")
	if out := chartFails(t, "--set", "serviceAccount.create=false"); !strings.Contains(out, "serviceAccount.name") {
		t.Errorf("no ServiceAccount at all: %s", out)
	}
}

// checkSubjects checks every binding binds the ServiceAccount sa, and that
// the manager's admission policy matches its requests.
func checkSubjects(t *testing.T, r rendered, sa string) {
	t.Helper()
	for _, obj := range r {
		switch obj.GetKind() {
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			strictFrom(t, obj, &b)
			if len(b.Subjects) != 1 || b.Subjects[0].Name != sa {
				t.Errorf("%s %s binds %+v, want %s", obj.GetKind(), obj.GetName(), b.Subjects, sa)
			}
		case "ValidatingAdmissionPolicy":
			if !strings.HasSuffix(obj.GetName(), "-manager-writes") {
				continue
			}
			conds, _, _ := unstructured.NestedSlice(obj.Object, "spec", "matchConditions")
			expr, _ := conds[0].(map[string]any)["expression"].(string)
			if !strings.Contains(expr, "':"+sa+"'") {
				t.Errorf("the manager's policy does not match ServiceAccount %s: %s", sa, expr)
			}
		}
	}
}

func TestChartExtras(t *testing.T) {
	values := `
manager:
  logLevel: debug
  extraArgs: ["--zap-stacktrace-level=panic", "--enable-http2"]
  extraEnv: [{name: GOMEMLIMIT, value: 200MiB}]
  extraVolumes: [{name: scratch, emptyDir: {}}]
  extraVolumeMounts: [{name: scratch, mountPath: /scratch}]
`
	c := renderChart(t, "--values", writeValues(t, values)).deployment(t).Spec.Template.Spec
	mc := c.Containers[0]
	o := checkManagerArgs(t, mc.Args)
	if !o.enableHTTP2 || !slices.Contains(mc.Args, "--zap-stacktrace-level=panic") || !slices.Contains(mc.Args, "--zap-log-level=debug") {
		t.Errorf("args %v", mc.Args)
	}
	if !slices.ContainsFunc(mc.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" && e.Value == "200MiB" }) {
		t.Errorf("env %v", mc.Env)
	}
	if !slices.ContainsFunc(c.Volumes, func(v corev1.Volume) bool { return v.Name == "scratch" && v.EmptyDir != nil }) ||
		!slices.ContainsFunc(mc.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "scratch" && m.MountPath == "/scratch" }) {
		t.Errorf("volumes %v, mounts %v", c.Volumes, mc.VolumeMounts)
	}
	for _, flag := range []string{"--leader-elect=false", "--metrics-bind-address=:9090", "--redis-cluster-addrs=x:1"} {
		if out := chartFails(t, "--set-json", `manager.extraArgs=["`+flag+`"]`); !strings.Contains(out, "manager.extraArgs may not set") {
			t.Errorf("extraArgs %s: %s", flag, out)
		}
	}
}

// Each Redis mode gives the manager the flags and environment it reads,
// which it accepts, and the Secrets mounted where the flags and variables
// point.
func TestChartRedisModes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		values   string
		check    func(t *testing.T, o *options, env map[string]string)
		wantEnv  []string
		noEnv    []string
		mounts   map[string]string // file -> Secret/key
		hasFlags []string
	}{
		{
			name:    "standalone",
			values:  `{}`,
			wantEnv: []string{"REDIS_URL", "REDIS_USERNAME", "REDIS_PASSWORD_FILE"},
			noEnv:   []string{"REDIS_SENTINEL_PASSWORD_FILE", "REDIS_SENTINEL_USERNAME"},
			mounts:  map[string]string{"/etc/lockwarden/redis/password": "lockwarden-redis/password"},
		},
		{
			name: "sentinel with its own password and TLS with a private CA",
			values: `redis:
  mode: sentinel
  sentinel: {addrs: ["s-0.redis:26379", "s-1.redis:26379"], masterName: mymaster, username: sentinel-user, passwordSecret: {name: sentinel-auth, key: pw}}
  tls: {enable: true, caSecret: {name: redis-ca, key: bundle.pem}}`,
			check: func(t *testing.T, o *options, env map[string]string) {
				if o.sentinels != "s-0.redis:26379,s-1.redis:26379" || o.redisCfg.SentinelMaster != "mymaster" || !o.redisCfg.TLS ||
					o.redisCfg.CAFile != "/etc/lockwarden/redis-ca/ca.crt" || env["REDIS_SENTINEL_USERNAME"] != "sentinel-user" {
					t.Errorf("options %+v, env %v", o, env)
				}
			},
			wantEnv: []string{"REDIS_USERNAME", "REDIS_PASSWORD_FILE", "REDIS_SENTINEL_PASSWORD_FILE", "REDIS_SENTINEL_USERNAME"},
			noEnv:   []string{"REDIS_URL"},
			mounts: map[string]string{
				"/etc/lockwarden/redis/password": "lockwarden-redis/password", "/etc/lockwarden/redis-sentinel/password": "sentinel-auth/pw",
				"/etc/lockwarden/redis-ca/ca.crt": "redis-ca/bundle.pem",
			},
		},
		{
			name:   "cluster",
			values: `redis: {mode: cluster, cluster: {addrs: ["n-0.redis:6379", "n-1.redis:6379", "n-2.redis:6379"]}, tls: {enable: true}}`,
			check: func(t *testing.T, o *options, _ map[string]string) {
				if o.cluster != "n-0.redis:6379,n-1.redis:6379,n-2.redis:6379" || !o.redisCfg.TLS || o.redisCfg.CAFile != "" {
					t.Errorf("options %+v", o)
				}
			},
			wantEnv: []string{"REDIS_USERNAME", "REDIS_PASSWORD_FILE"},
			noEnv:   []string{"REDIS_URL", "REDIS_SENTINEL_PASSWORD_FILE"},
			mounts:  map[string]string{"/etc/lockwarden/redis/password": "lockwarden-redis/password"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := renderChart(t, "--values", writeValues(t, tc.values))
			pod := r.deployment(t).Spec.Template.Spec
			c := pod.Containers[0]
			o := checkManagerArgs(t, c.Args)
			env := containerEnvNames(t, r, &c)
			for _, name := range tc.wantEnv {
				if _, ok := env[name]; !ok {
					t.Errorf("no %s in %v", name, env)
				}
			}
			for _, name := range tc.noEnv {
				if _, ok := env[name]; ok {
					t.Errorf("%s is set: %v", name, env)
				}
			}
			// The manager's own check: exactly one of URL, Sentinel, Cluster.
			cfg := o.redisCfg
			cfg.SentinelAddrs, cfg.ClusterAddrs = strings.Split(o.sentinels, ","), strings.Split(o.cluster, ",")
			if o.sentinels == "" {
				cfg.SentinelAddrs = nil
			}
			if o.cluster == "" {
				cfg.ClusterAddrs = nil
			}
			if _, ok := env["REDIS_URL"]; ok {
				cfg.URL = "redis://from-the-secret:6379/0"
			}
			cfg.CAFile = "" // mounted only in the pod
			if _, err := cfg.Client(); err != nil {
				t.Errorf("the manager refuses this Redis configuration: %v", err)
			}
			files := mountedSecretFiles(pod, c)
			for file, want := range tc.mounts {
				if files[file] != want {
					t.Errorf("%s is %q, want the Secret key %s (mounted: %v)", file, files[file], want, files)
				}
			}
			for _, v := range []string{"REDIS_PASSWORD_FILE", "REDIS_SENTINEL_PASSWORD_FILE"} {
				if f, ok := env[v]; ok && files[f] == "" {
					t.Errorf("%s=%s is no mounted Secret key (%v)", v, f, files)
				}
			}
			if tc.check != nil {
				tc.check(t, o, env)
			}
		})
	}
}

// containerEnvNames resolves the container's variables to their values, or
// to "secret:NAME/KEY" and "field:PATH" for references, including the
// ConfigMap's.
func containerEnvNames(t *testing.T, r rendered, c *corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		var cm corev1.ConfigMap
		strictFrom(t, r.find(t, "ConfigMap", from.ConfigMapRef.Name), &cm)
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		}
	}
	return env
}

// mountedSecretFiles maps each file the container sees from a Secret volume
// to "secret/key".
func mountedSecretFiles(pod corev1.PodSpec, c corev1.Container) map[string]string {
	files := map[string]string{}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, item := range v.Secret.Items {
				files[filepath.Join(m.MountPath, item.Path)] = v.Secret.SecretName + "/" + item.Key
			}
		}
	}
	return files
}

// Each bad combination is refused with a message naming what to change.
func TestChartGuardRails(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "manager.replica=3"}, "additional properties 'replica' not allowed"},
		{[]string{"--set", "metrics.enabled=true"}, "additional properties 'enabled' not allowed"},
		{[]string{"--set", "manager.replicas=two"}, "manager/replicas"},
		{[]string{"--set", "leaderElection.enable=false"}, "leaderElection.enable=false would run 2 managers"},
		{[]string{"--set", "manager.replicas=0"}, "replicas"},
		{[]string{"--set", "leaderElection.leaseDuration=15"}, "leaseDuration"},
		{[]string{"--set", "manager.terminationGracePeriodSeconds=30"}, "terminationGracePeriodSeconds"},
		{[]string{"--set", "metrics.enable=false", "--set", "metrics.serviceMonitor.enable=true"}, "metrics.serviceMonitor.enable needs metrics.enable"},
		{[]string{"--set", "metrics.enable=false", "--set", "metrics.prometheusRule.enable=true"}, "metrics.prometheusRule.enable needs metrics.enable"},
		{[]string{"--set", "metrics.serviceMonitor.enable=true"}, "metrics.certManager.enable=true, or metrics.serviceMonitor.insecureSkipVerify=true"},
		{[]string{"--set", "metrics.secure=false", "--set", "metrics.certManager.enable=true"}, "metrics.certManager.enable needs metrics.enable and metrics.secure"},
		{[]string{"--set", "metrics.enable=false", "--set", "networkPolicy.enable=true"}, "networkPolicy.enable admits scrapers"},
		{[]string{"--set", "redis.mode=sentinel"}, "redis.mode=sentinel needs redis.sentinel.addrs"},
		{[]string{"--set", "redis.mode=cluster"}, "redis.mode=cluster needs redis.cluster.addrs"},
		{[]string{"--set", "redis.mode=replicated"}, "redis/mode"},
		{[]string{"--set", "redis.sentinel.masterName=m"}, "redis.sentinel.* is set but redis.mode is standalone"},
		{[]string{"--set-json", `redis.cluster.addrs=["a:1"]`}, "redis.cluster.addrs is set but redis.mode is standalone"},
		{[]string{"--set-json", `redis.cluster.addrs=["no-port"]`}, "redis/cluster/addrs"},
		{[]string{"--set", "redis.tls.enable=true"}, "in standalone mode TLS comes from the Secret's url: rediss://"},
		{[]string{"--set", "fullnameOverride=a-name-of-more-than-twenty-eight"}, "fullnameOverride"},
		{[]string{"lockwarden-for-the-payments-team-prod"}, "above 28"},
	} {
		release, args := "lockwarden", tc.args
		if len(args) == 1 { // a release name
			release, args = args[0], nil
		}
		if out := chartFailsAs(t, release, args...); !strings.Contains(out, tc.want) {
			t.Errorf("%v: helm says\n%s\nwant it to mention %q", tc.args, out, tc.want)
		}
	}
}

// Names and selectors are the release's: another release's objects,
// cluster-scoped included, never share a name with this one's, and each
// release's selectors select its own manager pods only.
func TestChartNamesAndSelectors(t *testing.T) {
	a := renderChart(t)
	b := rendered(helmTemplateAs(t, "payments"))
	c := renderChart(t, "--set", "fullnameOverride=lw")
	names := func(r rendered) map[string]bool {
		out := map[string]bool{}
		for _, obj := range r {
			out[obj.GetKind()+" "+obj.GetNamespace()+"/"+obj.GetName()] = true
		}
		return out
	}
	na := names(a)
	for key := range names(b) {
		if na[key] && !strings.HasPrefix(key, "CustomResourceDefinition ") {
			t.Errorf("releases lockwarden and payments both render %s", key)
		}
	}
	for _, obj := range c {
		if obj.GetKind() != "CustomResourceDefinition" && !strings.HasPrefix(obj.GetName(), "lw-") {
			t.Errorf("fullnameOverride=lw: %s %s", obj.GetKind(), obj.GetName())
		}
	}
	checkSubjects(t, b, "payments-lockwarden-controller-manager")
	checkSubjects(t, c, "lw-controller-manager")

	for _, r := range []rendered{a, b} {
		d := r.deployment(t)
		own := labels.Set(d.Spec.Template.Labels)
		other := labels.Set{"app.kubernetes.io/name": "other-operator", "control-plane": "controller-manager"}
		otherRelease := labels.Set{}
		for k, v := range own {
			otherRelease[k] = v
		}
		otherRelease["app.kubernetes.io/instance"] = "another-release"
		if own["app.kubernetes.io/name"] != "lockwarden" || own["app.kubernetes.io/instance"] != d.Labels["app.kubernetes.io/instance"] {
			t.Errorf("pod labels %v", own)
		}
		var pdb policyv1.PodDisruptionBudget
		strictFrom(t, r.find(t, "PodDisruptionBudget", ""), &pdb)
		var svc corev1.Service
		strictFrom(t, r.find(t, "Service", ""), &svc)
		for what, sel := range map[string]*metav1.LabelSelector{
			"Deployment": d.Spec.Selector, "PodDisruptionBudget": pdb.Spec.Selector,
			"metrics Service": {MatchLabels: svc.Spec.Selector},
			"anti-affinity":   d.Spec.Template.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector,
		} {
			if !selects(t, sel, own) || selects(t, sel, other) || selects(t, sel, otherRelease) {
				t.Errorf("%s selector %v: want the release's manager pods only", what, sel)
			}
		}
		if pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != policyv1.AlwaysAllow {
			t.Errorf("the PodDisruptionBudget lets an unhealthy manager block drains: %+v", pdb.Spec)
		}
	}
}

// Each monitoring part is rendered only when asked for, and works with the
// rest: the ServiceMonitor selects the metrics Service and verifies the
// cert-manager certificate the manager serves, the NetworkPolicy admits the
// metrics port to the manager pods, and the alerts and dashboard are
// config/'s.
func TestChartMonitoring(t *testing.T) {
	off := renderChart(t)
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "Certificate", "Issuer", "NetworkPolicy"} {
		if off.has(kind) {
			t.Errorf("the defaults render a %s", kind)
		}
	}
	if slices.ContainsFunc(off, func(o *unstructured.Unstructured) bool { return strings.HasSuffix(o.GetName(), "grafana-dashboard") }) {
		t.Error("the defaults render the dashboard")
	}

	on := renderChart(t, "--set", "metrics.serviceMonitor.enable=true", "--set", "metrics.serviceMonitor.labels.release=prometheus",
		"--set", "metrics.certManager.enable=true", "--set", "metrics.prometheusRule.enable=true", "--set", "metrics.prometheusRule.labels.role=alerts",
		"--set", "metrics.dashboard.enable=true", "--set", "networkPolicy.enable=true")
	d := on.deployment(t)
	pod := d.Spec.Template.Spec
	svc := on.find(t, "Service", "lockwarden-controller-manager-metrics-service")
	sm := on.find(t, "ServiceMonitor", "")
	if l := sm.GetLabels(); l["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v", l)
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !labels.SelectorFromSet(smSel).Matches(labels.Set(svc.GetLabels())) {
		t.Errorf("the ServiceMonitor's selector %v does not select the metrics Service %v", smSel, svc.GetLabels())
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep := endpoints[0].(map[string]any)
	tls := ep["tlsConfig"].(map[string]any)
	if ep["honorLabels"] != true || tls["serverName"] != "lockwarden-controller-manager-metrics-service.lockwarden-system.svc" || tls["insecureSkipVerify"] != false {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}
	cert := on.find(t, "Certificate", "")
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	on.find(t, "Issuer", issuer)
	if !slices.Contains(dns, tls["serverName"].(string)) || tls["ca"].(map[string]any)["secret"].(map[string]any)["name"] != secret {
		t.Errorf("the certificate (%v, %s) is not the one the ServiceMonitor verifies (%v)", dns, secret, tls)
	}
	o := checkManagerArgs(t, pod.Containers[0].Args)
	if files := mountedSecretFiles(pod, pod.Containers[0]); files[filepath.Join(o.metricsCertDir, o.metricsCertName)] != secret+"/tls.crt" ||
		files[filepath.Join(o.metricsCertDir, o.metricsCertKey)] != secret+"/tls.key" {
		t.Errorf("the manager (--metrics-cert-path %s) does not serve the certificate's Secret %s: %v", o.metricsCertDir, secret, files)
	}
	// A ServiceMonitor without cert-manager skips verification only when
	// told to.
	insecure := renderChart(t, "--set", "metrics.serviceMonitor.enable=true", "--set", "metrics.serviceMonitor.insecureSkipVerify=true")
	if v, _, _ := unstructured.NestedFieldNoCopy(insecure.find(t, "ServiceMonitor", "").Object, "spec", "endpoints"); v.([]any)[0].(map[string]any)["tlsConfig"].(map[string]any)["insecureSkipVerify"] != true {
		t.Errorf("insecureSkipVerify not applied: %v", v)
	}
	// Another issuer: no Issuer of the chart's.
	own := renderChart(t, "--set", "metrics.certManager.enable=true", "--set", "metrics.certManager.issuerRef.name=corp-ca", "--set", "metrics.certManager.issuerRef.kind=ClusterIssuer")
	if own.has("Issuer") {
		t.Error("an issuerRef still renders the self-signed Issuer")
	}
	if ref, _, _ := unstructured.NestedStringMap(own.find(t, "Certificate", "").Object, "spec", "issuerRef"); ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" {
		t.Errorf("issuerRef %v", ref)
	}

	var np networkingv1.NetworkPolicy
	strictFrom(t, on.find(t, "NetworkPolicy", ""), &np)
	if !selects(t, &np.Spec.PodSelector, labels.Set(d.Spec.Template.Labels)) || len(np.Spec.Ingress) != 1 ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 8443 || np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["metrics"] != "enabled" ||
		slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("NetworkPolicy %+v", np.Spec)
	}
	egress := renderChart(t, "--set", "networkPolicy.enable=true", "--set-json", `networkPolicy.egress=[{"ports":[{"port":6379}]}]`)
	strictFrom(t, egress.find(t, "NetworkPolicy", ""), &np)
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Egress) != 1 {
		t.Errorf("egress not applied: %+v", np.Spec)
	}

	rule := on.find(t, "PrometheusRule", "")
	if rule.GetLabels()["role"] != "alerts" {
		t.Errorf("PrometheusRule labels %v", rule.GetLabels())
	}
	want := decodeFile(t, filepath.Join("..", "..", "config", "alerts", "prometheusrule.yaml"))
	if !reflect.DeepEqual(rule.Object["spec"], want.Object["spec"]) {
		t.Error("the chart's alerts are not config/alerts'")
	}
	dash := on.find(t, "ConfigMap", "lockwarden-grafana-dashboard")
	if dash.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v", dash.GetLabels())
	}
	data, _, _ := unstructured.NestedString(dash.Object, "data", "lockwarden.json")
	file, err := os.ReadFile(filepath.Join("..", "..", "config", "grafana", "lockwarden.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(data)) || strings.TrimSpace(data) != strings.TrimSpace(string(file)) {
		t.Error("the chart's dashboard is not config/grafana's")
	}
}

// config/default with every monitoring component uncommented, as its
// kustomization says to, holds what the chart renders with every
// monitoring value on.
func TestConfigMonitoringComponentsMatchChart(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-R", filepath.Join("..", "..", "config"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	kfile := filepath.Join(dir, "config", "default", "kustomization.yaml")
	data, err := os.ReadFile(kfile)
	if err != nil {
		t.Fatal(err)
	}
	enabled := strings.ReplaceAll(strings.Replace(string(data), "\n#components:\n", "\ncomponents:\n", 1), "\n#- ../", "\n- ../")
	if strings.Count(enabled, "\n- ../") != strings.Count(string(data), "\n- ../")+5 {
		t.Fatalf("config/default/kustomization.yaml does not list the five monitoring components, commented out:\n%s", data)
	}
	if err := os.WriteFile(kfile, []byte(enabled), 0o644); err != nil {
		t.Fatal(err)
	}
	built := kustomizeBuild(t, filepath.Join(dir, "config", "default"))
	chart := renderChart(t, "--set", "metrics.serviceMonitor.enable=true", "--set", "metrics.certManager.enable=true",
		"--set", "metrics.prometheusRule.enable=true", "--set", "metrics.dashboard.enable=true", "--set", "networkPolicy.enable=true")
	compareChartWithKustomize(t, chart, built)
}

// The uninstall hook, with crd.keep=false only: a pre-delete Job running
// `manager --uninstall` as a ServiceAccount that may delete and finalize
// every lock and read the leader Lease, and nothing else.
func TestChartUninstallHook(t *testing.T) {
	if r := renderChart(t); r.has("Job") {
		t.Error("crd.keep=true renders an uninstall hook: it would delete every lock the CRD keeps")
	}
	r := renderChart(t, "--set", "crd.keep=false", "--set", "uninstall.timeout=90s")
	var job batchv1.Job
	strictFrom(t, r.find(t, "Job", ""), &job)
	hookObjects := 0
	for _, obj := range r {
		if obj.GetAnnotations()["helm.sh/hook"] == "pre-delete" {
			hookObjects++
			if !strings.Contains(obj.GetAnnotations()["helm.sh/hook-delete-policy"], "before-hook-creation") {
				t.Errorf("%s %s: hook-delete-policy %q", obj.GetKind(), obj.GetName(), obj.GetAnnotations()["helm.sh/hook-delete-policy"])
			}
		}
	}
	if hookObjects != 6 || job.Annotations["helm.sh/hook"] != "pre-delete" {
		t.Errorf("%d pre-delete hook objects, want 6 (ServiceAccount, ClusterRole and binding, Role and binding, Job)", hookObjects)
	}
	c := job.Spec.Template.Spec.Containers[0]
	o := checkManagerArgs(t, c.Args)
	if !o.uninstall || o.uninstallTimeout.String() != "1m30s" || o.uninstallLease != "lockwarden-system/"+leaderElectionID {
		t.Errorf("the hook runs %v", c.Args)
	}
	var role rbacv1.ClusterRole
	strictFrom(t, r.find(t, "ClusterRole", job.Spec.Template.Spec.ServiceAccountName), &role)
	if len(role.Rules) != 1 || role.Rules[0].Resources[0] != "distributedlocks" || !slices.Equal(role.Rules[0].Verbs, []string{"get", "list", "delete", "patch"}) {
		t.Errorf("the hook's ClusterRole: %+v", role.Rules)
	}
	// Without leader election there is no Lease to read.
	one := renderChart(t, "--set", "crd.keep=false", "--set", "leaderElection.enable=false", "--set", "manager.replicas=1")
	strictFrom(t, one.find(t, "Job", ""), &job)
	if o := checkManagerArgs(t, job.Spec.Template.Spec.Containers[0].Args); o.uninstallLease != "" || one.has("Role") {
		t.Errorf("without leader election the hook reads a Lease: %v", job.Spec.Template.Spec.Containers[0].Args)
	}
}

// The gating policy follows the API the cluster serves.
func TestChartMutatingPolicyVersion(t *testing.T) {
	version := func(r rendered) string {
		for _, obj := range r {
			if obj.GetKind() == "MutatingAdmissionPolicy" {
				return obj.GetAPIVersion()
			}
		}
		return "none"
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "admissionregistration.k8s.io/v1"}, // no cluster: the default
		{[]string{"--api-versions", "v1/Pod", "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}, "admissionregistration.k8s.io/v1"},
		{[]string{"--api-versions", "v1/Pod", "--api-versions", "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"}, "admissionregistration.k8s.io/v1beta1"},
		{[]string{"--api-versions", "v1/Pod"}, "none"},
		{[]string{"--set", "admission.mutatingPolicyVersion=v1beta1"}, "admissionregistration.k8s.io/v1beta1"},
		{[]string{"--set", "admission.mutatingPolicyVersion=none"}, "none"},
	} {
		r := renderChart(t, tc.args...)
		if got := version(r); got != tc.want {
			t.Errorf("%v: the gating policy is %s, want %s", tc.args, got, tc.want)
		}
		bindings := 0
		for _, obj := range r {
			if obj.GetKind() == "MutatingAdmissionPolicyBinding" {
				bindings++
			}
		}
		if (bindings == 0) != (tc.want == "none") {
			t.Errorf("%v: %d bindings", tc.args, bindings)
		}
	}
}

// NOTES.txt says what to do next: the Secret, the image, the gates.
func TestChartNotes(t *testing.T) {
	notes := func(args ...string) string { return chartNotes(t, args...) }
	n := notes()
	for _, want := range []string{"create secret generic lockwarden-redis", "--from-literal=url=", "publishes no image", "lockwarden-gate"} {
		if !strings.Contains(n, want) {
			t.Errorf("NOTES lack %q:\n%s", want, n)
		}
	}
	n = notes("--set", "manager.image.repository=registry.example/lw", "--set", "admission.mutatingPolicyVersion=none", "--set", "crd.keep=false")
	if strings.Contains(n, "publishes no image") || !strings.Contains(n, "registry.example/lw:") || !strings.Contains(n, "by hand") || !strings.Contains(n, "pre-delete hook") {
		t.Errorf("NOTES:\n%s", n)
	}
}

// chartNotes renders NOTES.txt with the values args give. helm template
// does not render NOTES.txt, and helm install --dry-run=client wants a
// cluster: a copy of the chart renders it into a ConfigMap with tpl, in the
// same context.
func chartNotes(t *testing.T, args ...string) string {
	t.Helper()
	chart := filepath.Join(t.TempDir(), "lockwarden")
	if out, err := exec.Command("cp", "-R", chartDir, chart).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	text, err := os.ReadFile(filepath.Join(chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for file, data := range map[string]string{
		"files/notes.txt":         string(text),
		"templates/zz-notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get \"files/notes.txt\") . | indent 4 }}\n",
	} {
		if err := os.WriteFile(filepath.Join(chart, file), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return string(helm(t, append([]string{"template", "lockwarden", chart, "--namespace", "lockwarden-system", "--kube-version", kubeVersion, "--show-only", "templates/zz-notes.yaml"}, args...)...))
}

// dist/chart/files holds copies of config/'s generated and opt-in
// manifests, which `make manifests` refreshes; they must not drift.
func TestChartFilesAreConfigs(t *testing.T) {
	for copy, source := range map[string]string{
		"files/crds/locks.lockwarden.dev_distributedlocks.yaml": "config/crd/bases/locks.lockwarden.dev_distributedlocks.yaml",
		"files/rbac/manager-role.yaml":                          "config/rbac/role.yaml",
		"files/admission/fencing.yaml":                          "config/admission/fencing.yaml",
		"files/admission/gate.yaml":                             "config/admission/gate.yaml",
		"files/admission/manager.yaml":                          "config/admission/manager.yaml",
		"files/monitoring/prometheusrule.yaml":                  "config/alerts/prometheusrule.yaml",
		"files/monitoring/lockwarden.json":                      "config/grafana/lockwarden.json",
	} {
		a, err := os.ReadFile(filepath.Join(chartDir, copy))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join("..", "..", source))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("dist/chart/%s differs from %s: run make manifests", copy, source)
		}
	}
}

// The chart's README is generated from values.yaml's comments, and every
// value is documented.
func TestChartReadmeIsGenerated(t *testing.T) {
	cmd := exec.Command("go", "run", "./chartdoc", "-check", "-chart", mustAbs(t, chartDir))
	cmd.Dir = filepath.Join("..", "..", "hack", "tools", "release")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

func writeValues(t *testing.T, values string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func decodeFile(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// The alerts and the dashboard are valid PromQL to Prometheus's own parser,
// and each alert's annotations name only labels its expression keeps
// (hack/tools/promql).
func TestAlertsAndDashboardParse(t *testing.T) {
	cmd := exec.Command("go", "run", ".",
		"-rules", mustAbs(t, filepath.Join("..", "..", "config", "alerts", "prometheusrule.yaml")),
		"-dashboard", mustAbs(t, filepath.Join("..", "..", "config", "grafana", "lockwarden.json")))
	cmd.Dir = filepath.Join("..", "..", "hack", "tools", "promql")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// The overlays for clusters before Kubernetes 1.36 hold what the chart
// renders there: without the gating policy, or with it in v1beta1.
func TestConfigOlderClustersMatchChart(t *testing.T) {
	for overlay, version := range map[string]string{"without-gating-policy": "none", "gating-v1beta1": "v1beta1"} {
		t.Run(overlay, func(t *testing.T) {
			compareChartWithKustomize(t, renderChart(t, "--set", "admission.mutatingPolicyVersion="+version),
				kustomizeBuild(t, filepath.Join("..", "..", "config", overlay)))
		})
	}
}
