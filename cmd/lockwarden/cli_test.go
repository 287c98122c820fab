package main

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// redisToken is the fencing token Redis holds for the scenario's lock,
// which the manager granted to the holder: the oracle for what `why` says
// of the hold, read from Redis rather than from the lock's status.
func (c *cluster) redisToken(t *testing.T, s *scenario) int64 {
	t.Helper()
	info, err := c.redis.Inspect(context.Background(), s.key)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Holders) != 1 || !strings.HasPrefix(string(info.Holders[0].Owner), s.holderUID+":") {
		t.Fatalf("Redis key %s is held by %+v, want the holder pod %s (UID %s)", s.key, info.Holders, s.holder, s.holderUID)
	}
	return info.Token
}

// The old CLI parsed with Go's flag package, which stops at the first
// argument: `why POD -n NS` failed with "give one pod name".
func TestWhyTakesKubectlFlagsAnywhere(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	token := c.redisToken(t, s)
	wantWaiter := []string{
		fmt.Sprintf("pod %s waits behind 1 scheduling gate(s)", s.waiter),
		fmt.Sprintf("lock %s (key %s): held by pod %s (fencing token %d); waiting: 1st of 1 in line", lockName, s.key, s.holder, token),
	}
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"why", s.waiter, "-n", s.ns, "--kubeconfig", c.kubeconfig}},
		{nil, []string{"--kubeconfig", c.kubeconfig, "why", "-n", s.ns, s.waiter}},
		{nil, []string{"-n", s.ns, "why", s.waiter, "--kubeconfig=" + c.kubeconfig}},
		{nil, []string{"why", "--namespace=" + s.ns, "--kubeconfig", c.kubeconfig, s.waiter}},
		{[]string{"KUBECONFIG=" + c.kubeconfig}, []string{"why", s.waiter, "--namespace", s.ns}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := cli(t, tc.env, tc.args...)
			wantOK(t, tc.args, code, stdout, stderr)
			for _, w := range wantWaiter {
				if !strings.Contains(stdout, w) {
					t.Fatalf("lockwarden %v says\n%s\nwant it to say %q", tc.args, stdout, w)
				}
			}
		})
	}
	args := []string{"why", s.holder, "-n", s.ns, "--kubeconfig", c.kubeconfig}
	code, stdout, stderr := cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if w := fmt.Sprintf("lock %s (key %s): granted to it, fencing token %d", lockName, s.key, token); !strings.Contains(stdout, w) {
		t.Fatalf("lockwarden %v says\n%s\nwant it to say %q", args, stdout, w)
	}
}

// twoContexts writes a kubeconfig whose current context, "elsewhere",
// points at a port nothing listens on, and whose context "live" is the
// test cluster's, with namespace ns.
func (c *cluster) twoContexts(t *testing.T, ns string) string {
	t.Helper()
	cfg := c.admin.DeepCopy()
	live := cfg.Contexts[cfg.CurrentContext].DeepCopy()
	live.Namespace = ns
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", InsecureSkipTLSVerify: true}
	cfg.Contexts = map[string]*clientcmdapi.Context{
		"live":      live,
		"elsewhere": {Cluster: "nowhere", AuthInfo: live.AuthInfo, Namespace: ns},
	}
	cfg.CurrentContext = "elsewhere"
	path := filepath.Join(t.TempDir(), "two-contexts.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestWhyContextPicksTheCluster(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	kubeconfig := c.twoContexts(t, s.ns)

	// The live context, and its namespace: no -n.
	args := []string{"why", s.waiter, "--context", "live", "--kubeconfig", kubeconfig}
	code, stdout, stderr := cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if w := fmt.Sprintf("pod %s waits behind 1 scheduling gate(s)", s.waiter); !strings.Contains(stdout, w) {
		t.Fatalf("lockwarden %v says\n%s\nwant it to say %q", args, stdout, w)
	}
	// The current context, where nothing listens, when --context is not
	// given.
	code, stdout, stderr = cli(t, []string{"KUBECONFIG=" + kubeconfig}, "why", s.waiter)
	if code != exitUnavailable || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Fatalf("lockwarden why in the context elsewhere: exit status %d, want %d naming 127.0.0.1:1\nstdout:\n%s\nstderr:\n%s", code, exitUnavailable, stdout, stderr)
	}
	code, _, stderr = cli(t, nil, "why", s.waiter, "--context", "nosuch", "--kubeconfig", kubeconfig)
	if code != exitUnavailable || !strings.Contains(stderr, "context was not found for specified context: nosuch") {
		t.Fatalf("lockwarden why --context nosuch: exit status %d, want %d naming the context; stderr:\n%s", code, exitUnavailable, stderr)
	}
}

// report is the part of `why -o json|yaml` the tests read.
type report struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Pod        string `json:"pod"`
	Namespace  string `json:"namespace"`
	Gates      int    `json:"gates"`
	Locks      []struct {
		Name   string `json:"name"`
		Gated  bool   `json:"gated"`
		Found  bool   `json:"found"`
		Key    string `json:"key"`
		Holder *struct {
			Pod                 string `json:"pod"`
			ThisPod             bool   `json:"thisPod"`
			GrantedByController bool   `json:"grantedByController"`
			Token               int64  `json:"token"`
		} `json:"holder"`
		Position int `json:"position"`
		Waiting  int `json:"waiting"`
	} `json:"locks"`
}

func TestWhyOutputFormats(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	token := c.redisToken(t, s)
	why := func(t *testing.T, pod string, unmarshal func([]byte, any) error, output ...string) report {
		t.Helper()
		args := append([]string{"why", pod, "-n", s.ns, "--kubeconfig", c.kubeconfig}, output...)
		code, stdout, stderr := cli(t, nil, args...)
		wantOK(t, args, code, stdout, stderr)
		var r report
		if err := unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("lockwarden %v: %v in\n%s", args, err, stdout)
		}
		if r.APIVersion != reportKind.GroupVersion().String() || r.Kind != reportKind.Kind || r.Pod != pod || r.Namespace != s.ns || len(r.Locks) != 1 {
			t.Fatalf("lockwarden %v printed %+v\n%s", args, r, stdout)
		}
		if l := r.Locks[0]; l.Name != lockName || !l.Found || l.Key != s.key || l.Holder == nil || l.Holder.Pod != s.holder || l.Holder.Token != token {
			t.Fatalf("lockwarden %v: lock %+v, want %s (key %s) held by %s with token %d\n%s", args, l, lockName, s.key, s.holder, token, stdout)
		}
		return r
	}
	for _, format := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"json", json.Unmarshal}, {"yaml", func(b []byte, v any) error { return yaml.Unmarshal(b, v) }}} {
		t.Run(format.name, func(t *testing.T) {
			if format.name == "yaml" {
				// sigs.k8s.io/yaml also reads JSON: make sure it is YAML.
				args := []string{"why", s.waiter, "-n", s.ns, "--kubeconfig", c.kubeconfig, "-o", "yaml"}
				_, stdout, _ := cli(t, nil, args...)
				if !strings.HasPrefix(stdout, "apiVersion: ") {
					t.Fatalf("lockwarden %v printed no YAML:\n%s", args, stdout)
				}
			}
			w := why(t, s.waiter, format.unmarshal, "-o", format.name)
			if l := w.Locks[0]; w.Gates != 1 || !l.Gated || l.Holder.ThisPod || l.Position != 1 || l.Waiting != 1 {
				t.Fatalf("the waiter's report: %+v", w)
			}
			h := why(t, s.holder, format.unmarshal, "--output="+format.name)
			if l := h.Locks[0]; h.Gates != 0 || l.Gated || !l.Holder.ThisPod || !l.Holder.GrantedByController || l.Position != 0 {
				t.Fatalf("the holder's report: %+v", h)
			}
		})
	}
	t.Run("jsonpath", func(t *testing.T) {
		args := []string{"why", s.waiter, "-n", s.ns, "--kubeconfig", c.kubeconfig, "-o", "jsonpath={.locks[0].holder.pod} {.locks[0].position}"}
		code, stdout, stderr := cli(t, nil, args...)
		wantOK(t, args, code, stdout, stderr)
		if want := s.holder + " 1"; stdout != want {
			t.Fatalf("lockwarden %v printed %q, want %q", args, stdout, want)
		}
	})
	t.Run("unknown format", func(t *testing.T) {
		code, _, stderr := cli(t, nil, "why", s.waiter, "-n", s.ns, "--kubeconfig", c.kubeconfig, "-o", "xml")
		if code != exitUsage || !strings.Contains(stderr, `"xml"`) || !strings.Contains(stderr, "json") {
			t.Fatalf("-o xml: exit status %d, want %d naming the formats; stderr:\n%s", code, exitUsage, stderr)
		}
	})
}

// free --dry-run says what it would lift and changes nothing: not the pods'
// gates, not the lock's status, not the lock in Redis. free without it
// lifts the gates, so the same checks see a change.
func TestFreeDryRunChangesNothing(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	ctx := context.Background()
	before, err := c.redis.Inspect(ctx, s.key)
	if err != nil {
		t.Fatal(err)
	}
	status := c.lockStatus(t, s)
	gate := locksv1.GateFor(lockName)

	args := []string{"free", "-n", s.ns, "--dry-run", "--kubeconfig", c.kubeconfig}
	code, stdout, stderr := cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if want := fmt.Sprintf("would free %s/%s: would lift %s (dry run)\n", s.ns, s.waiter, gate); stdout != want {
		t.Fatalf("lockwarden %v printed %q, want %q", args, stdout, want)
	}
	args = []string{"free", "--dry-run", "-o", "json", "-n", s.ns, "--kubeconfig", c.kubeconfig}
	code, stdout, stderr = cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Metadata struct{ Name string }                             `json:"metadata"`
			Spec     struct{ SchedulingGates []struct{ Name string } } `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("lockwarden %v: %v in\n%s", args, err, stdout)
	}
	if list.Kind != "List" || len(list.Items) != 1 || list.Items[0].Metadata.Name != s.waiter || len(list.Items[0].Spec.SchedulingGates) != 0 {
		t.Fatalf("lockwarden %v printed %+v, want a List of %s as it would be, without gates", args, list, s.waiter)
	}
	args = []string{"free", "--dry-run", "-o", "name", "-n", s.ns, "--kubeconfig", c.kubeconfig}
	code, stdout, stderr = cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if want := "pod/" + s.waiter + "\n"; stdout != want {
		t.Fatalf("lockwarden %v printed %q, want %q", args, stdout, want)
	}

	if gates := c.gates(t, s.ns, s.waiter); len(gates) != 1 || gates[0].Name != gate {
		t.Fatalf("after free --dry-run, %s has gates %v, want %s still", s.waiter, gates, gate)
	}
	if after := c.lockStatus(t, s); !apiequality.Semantic.DeepEqual(after.Holder, status.Holder) || !slices.Equal(after.Waiting, status.Waiting) {
		t.Fatalf("after free --dry-run, the lock's status is %+v, was %+v", after, status)
	}
	after, err := c.redis.Inspect(ctx, s.key)
	if err != nil {
		t.Fatal(err)
	}
	if !sameHold(before, after) {
		t.Fatalf("after free --dry-run, Redis has %+v, had %+v", after, before)
	}

	// Without --dry-run the gate goes; the hold in Redis stays the
	// holder's (free takes and releases no lock).
	args = []string{"free", "-n", s.ns, "--kubeconfig", c.kubeconfig}
	code, stdout, stderr = cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if want := fmt.Sprintf("freed %s/%s: lifted %s\n", s.ns, s.waiter, gate); stdout != want {
		t.Fatalf("lockwarden %v printed %q, want %q", args, stdout, want)
	}
	if gates := c.gates(t, s.ns, s.waiter); len(gates) != 0 {
		t.Fatalf("after free, %s has gates %v", s.waiter, gates)
	}
	if after, err := c.redis.Inspect(ctx, s.key); err != nil || !sameHold(before, after) {
		t.Fatalf("after free, Redis has %+v (%v), had %+v", after, err, before)
	}
	code, stdout, stderr = cli(t, nil, args...)
	wantOK(t, args, code, stdout, stderr)
	if stdout != "" || !strings.Contains(stderr, "no pod in namespace "+s.ns+" carries a lockwarden gate") {
		t.Fatalf("a second free printed %q, stderr %q", stdout, stderr)
	}
}

// sameHold reports whether two snapshots of a lock show the same holders,
// fencing token and queue: its lease (TTL) runs on.
func sameHold(a, b redislock.LockInfo) bool {
	return slices.Equal(a.Holders, b.Holders) && a.Token == b.Token && slices.Equal(a.Waiters, b.Waiters)
}

func TestFreeUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"free"},
		{"free", "-n", "a", "-A"},
		{"free", "-n", "a", "pod"},
		{"free", "-A", "-o", "xml"},
	} {
		code, stdout, stderr := cli(t, nil, args...)
		if code != exitUsage || !strings.Contains(stderr, "lockwarden free: ") || !strings.Contains(stderr, "lockwarden free --help") {
			t.Fatalf("lockwarden %v: exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, exitUsage, stdout, stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := cli(t, nil, args...)
		wantOK(t, args, code, stdout, stderr)
		if stdout != testVersion+"\n" {
			t.Fatalf("lockwarden %v printed %q, want %q", args, stdout, testVersion+"\n")
		}
	}
	for _, format := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"json", json.Unmarshal}, {"yaml", func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }}} {
		args := []string{"version", "-o", format.name}
		code, stdout, stderr := cli(t, nil, args...)
		wantOK(t, args, code, stdout, stderr)
		var v versionInfo
		if err := format.unmarshal([]byte(stdout), &v); err != nil || v.Version != testVersion || !strings.HasPrefix(v.GoVersion, "go") || !strings.Contains(v.Platform, "/") {
			t.Fatalf("lockwarden %v printed %q (%+v, %v)", args, stdout, v, err)
		}
	}
	if code, _, stderr := cli(t, nil, "version", "-o", "xml"); code != exitUsage {
		t.Fatalf("version -o xml: exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}
}

func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	code, script, stderr := cli(t, nil, "completion", "bash")
	wantOK(t, []string{"completion", "bash"}, code, script, stderr)
	file := filepath.Join(t.TempDir(), "lockwarden.bash")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	// bash loads the script, and it registers a completion for lockwarden.
	out, err := exec.Command("bash", "-c", `source "$1" && complete -p lockwarden`, "bash", file).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "__start_lockwarden") {
		t.Fatalf("sourcing the bash script: %v\n%s", err, out)
	}
	for shell, want := range map[string]string{"zsh": "#compdef lockwarden", "fish": "complete -c lockwarden"} {
		code, script, stderr := cli(t, nil, "completion", shell)
		wantOK(t, []string{"completion", shell}, code, script, stderr)
		if !strings.Contains(script, want) {
			t.Fatalf("completion %s: no %q in\n%s", shell, want, script)
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "zsh"}} {
		if code, _, stderr := cli(t, nil, args...); code != exitUsage || !strings.Contains(stderr, "bash, zsh or fish") {
			t.Fatalf("lockwarden %v: exit status %d, want %d; stderr:\n%s", args, code, exitUsage, stderr)
		}
	}
}

// The shell scripts ask the binary (`__complete`) for pod names,
// namespaces and contexts from the cluster and the kubeconfig.
func TestCompletionFromTheCluster(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	kubeconfig := c.twoContexts(t, s.ns)
	complete := func(args ...string) []string {
		t.Helper()
		args = append([]string{"__complete", "--kubeconfig", kubeconfig, "--context", "live"}, args...)
		code, stdout, stderr := cli(t, nil, args...)
		wantOK(t, args, code, stdout, stderr)
		// The last line is the directive, ":4" (no file completion).
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if lines[len(lines)-1] != ":4" {
			t.Fatalf("lockwarden %v: directive %q, want :4\n%s%s", args, lines[len(lines)-1], stdout, stderr)
		}
		return lines[:len(lines)-1]
	}
	if got, want := complete("why", lockName+"-"), []string{s.holder, s.waiter}; !slices.Equal(got, want) {
		t.Fatalf("completing a pod name: %v, want %v", got, want)
	}
	if got := complete("why", "-n", "cli-"); !slices.Contains(got, s.ns) || slices.Contains(got, "default") {
		t.Fatalf("completing -n cli-: %v, want %s among them and no default", got, s.ns)
	}
	if got, want := complete("why", "--context", ""), []string{"elsewhere", "live"}; !slices.Equal(got, want) {
		t.Fatalf("completing --context: %v, want %v", got, want)
	}
}

// rootCommands are the commands the root's help must list.
var rootCommands = []string{"completion", "free", "help", "run", "version", "why"}

func TestHelpListsEveryCommand(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := cli(t, nil, "--help")
	wantOK(t, []string{"--help"}, code, stdout, stderr)
	listed := regexp.MustCompile(`(?m)^  (\S+)\s{2,}\S`).FindAllStringSubmatch(stdout[strings.Index(stdout, "Available Commands:"):], -1)
	var names []string
	for _, m := range listed {
		names = append(names, m[1])
	}
	if !slices.Equal(names, rootCommands) {
		t.Fatalf("--help lists the commands %v, want %v:\n%s", names, rootCommands, stdout)
	}
	if !strings.Contains(stdout, "Usage:\n  lockwarden [command]\n") || strings.Contains(stdout, "lockwarden [flags]") {
		t.Fatalf("--help's usage line:\n%s", stdout)
	}
	for _, flag := range []string{"--kubeconfig", "--context", "--namespace"} {
		if !strings.Contains(stdout, flag) {
			t.Fatalf("--help does not list %s:\n%s", flag, stdout)
		}
	}
	for _, name := range slices.DeleteFunc(slices.Clone(rootCommands), func(n string) bool { return n == "help" }) {
		for _, args := range [][]string{{name, "--help"}, {"help", name}} {
			code, stdout, stderr := cli(t, nil, args...)
			wantOK(t, args, code, stdout, stderr)
			if !strings.Contains(stdout, "lockwarden "+name) {
				t.Fatalf("lockwarden %v does not show %q's usage:\n%s", args, name, stdout)
			}
		}
	}
}

// plugin returns a directory holding kubectl-lockwarden, the test binary
// under the plugin's name.
func plugin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(binary, filepath.Join(dir, "kubectl-lockwarden")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPluginName(t *testing.T) {
	t.Parallel()
	kubectlLockwarden := filepath.Join(plugin(t), "kubectl-lockwarden")
	code, stdout, stderr := runBinary(t, kubectlLockwarden, nil, "--help")
	wantOK(t, []string{"--help"}, code, stdout, stderr)
	if !strings.Contains(stdout, "Usage:\n  kubectl lockwarden [command]\n") || !strings.Contains(stdout, `"kubectl lockwarden [command] --help"`) {
		t.Fatalf("kubectl-lockwarden --help:\n%s", stdout)
	}
	code, stdout, stderr = runBinary(t, kubectlLockwarden, nil, "why", "--help")
	wantOK(t, []string{"why", "--help"}, code, stdout, stderr)
	if !strings.Contains(stdout, "kubectl lockwarden why POD [flags]") {
		t.Fatalf("kubectl-lockwarden why --help:\n%s", stdout)
	}
	code, _, stderr = runBinary(t, kubectlLockwarden, nil, "why")
	if code != exitUsage || !strings.HasPrefix(stderr, "kubectl lockwarden why: give one pod name\nRun 'kubectl lockwarden why --help'") {
		t.Fatalf("kubectl-lockwarden why: exit status %d, stderr:\n%s", code, stderr)
	}
	// The completion script completes the binary's own name.
	code, stdout, stderr = runBinary(t, kubectlLockwarden, nil, "completion", "bash")
	wantOK(t, []string{"completion", "bash"}, code, stdout, stderr)
	if !strings.Contains(stdout, "kubectl-lockwarden") {
		t.Fatal("kubectl-lockwarden completion bash does not complete kubectl-lockwarden")
	}
}

// kubectl runs kubectl-lockwarden from the PATH for `kubectl lockwarden`,
// passing the rest of the line, kubectl's flags included.
func TestKubectlRunsThePlugin(t *testing.T) {
	c := testCluster(t)
	s := c.newScenario(t, "")
	path := "PATH=" + plugin(t) + string(os.PathListSeparator) + c.assets + string(os.PathListSeparator) + os.Getenv("PATH")
	kubectl := filepath.Join(c.assets, "kubectl")

	args := []string{"lockwarden", "why", s.waiter, "-n", s.ns, "--kubeconfig", c.kubeconfig}
	code, stdout, stderr := runBinary(t, kubectl, []string{path}, args...)
	wantOK(t, args, code, stdout, stderr)
	if w := fmt.Sprintf("lock %s (key %s): held by pod %s", lockName, s.key, s.holder); !strings.Contains(stdout, w) {
		t.Fatalf("kubectl %v says\n%s\nwant it to say %q", args, stdout, w)
	}
	code, stdout, stderr = runBinary(t, kubectl, []string{path}, "plugin", "list")
	if code != 0 || !strings.Contains(stdout, "kubectl-lockwarden") {
		t.Fatalf("kubectl plugin list: exit status %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runBinary(t, kubectl, []string{path}, "lockwarden", "--help")
	if code != 0 || !strings.Contains(stdout, "kubectl lockwarden [command]") {
		t.Fatalf("kubectl lockwarden --help: exit status %d\n%s%s", code, stdout, stderr)
	}
}

// make cli builds both names of the static, stripped binary, stamped with
// VERSION.
func TestMakeCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const v = "v0.0.0-makecli"
	if out, err := exec.Command("make", "--no-print-directory", "-C", filepath.Join("..", ".."), "cli", "CLI_DIR="+dir, "VERSION="+v).CombinedOutput(); err != nil {
		t.Fatalf("make cli: %v\n%s", err, out)
	}
	for _, name := range []string{"lockwarden", "kubectl-lockwarden"} {
		path := filepath.Join(dir, name)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		interp := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		symbols := f.Section(".symtab") != nil
		f.Close()
		if interp || symbols {
			t.Fatalf("%s: dynamically linked %v, symbol table %v; want static and stripped", name, interp, symbols)
		}
		code, stdout, stderr := runBinary(t, path, nil, "version")
		wantOK(t, []string{"version"}, code, stdout, stderr)
		if stdout != v+"\n" {
			t.Fatalf("%s version printed %q, want %q", name, stdout, v)
		}
	}
	_, stdout, _ := runBinary(t, filepath.Join(dir, "kubectl-lockwarden"), nil, "--help")
	if !strings.Contains(stdout, "kubectl lockwarden [command]") {
		t.Fatalf("kubectl-lockwarden --help:\n%s", stdout)
	}
}

// docsBlock is a shell block of docs/cli.md and the marker before it:
// "run", or "not run: REASON".
type docsBlock struct {
	marker, script string
}

// docsBlocks returns docs/cli.md's shell blocks. Each must carry a marker
// comment, so none is left untested without saying why.
func docsBlocks(t *testing.T) []docsBlock {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	all := regexp.MustCompile("(?m)^```sh\n").FindAllIndex(doc, -1)
	marked := regexp.MustCompile("(?s)<!-- cmd/lockwarden: (run|not run: [^>]+) -->\n```sh\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(marked) != len(all) {
		t.Fatalf("docs/cli.md has %d shell blocks, %d of them marked <!-- cmd/lockwarden: run --> or <!-- cmd/lockwarden: not run: REASON -->", len(all), len(marked))
	}
	var blocks []docsBlock
	for _, m := range marked {
		blocks = append(blocks, docsBlock{string(m[1]), string(m[2])})
	}
	return blocks
}

// TestDocsCLI runs docs/cli.md's shell blocks marked to run, in order, as
// written, with kubectl and the plugin on the PATH, against the scenario
// the page describes: namespace batch, nightly-report-1 holding the lock
// nightly-report, nightly-report-2 waiting.
func TestDocsCLI(t *testing.T) {
	blocks := docsBlocks(t)
	c := testCluster(t)
	c.newScenario(t, "batch")
	dir := plugin(t)
	if err := os.Symlink(binary, filepath.Join(dir, "lockwarden")); err != nil {
		t.Fatal(err)
	}
	// A copy of the kubeconfig, which the blocks may change.
	kubeconfig := filepath.Join(t.TempDir(), "config")
	if err := clientcmd.WriteToFile(*c.admin, kubeconfig); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"PATH=" + dir + string(os.PathListSeparator) + c.assets + string(os.PathListSeparator) + os.Getenv("PATH"),
		"KUBECONFIG=" + kubeconfig,
	}
	home := t.TempDir()
	ran := 0
	for i, b := range blocks {
		if b.marker != "run" {
			continue
		}
		ran++
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", b.script)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), append(env, "HOME="+home, "GORACE=atexit_sleep_ms=0")...)
		out, err := cmd.CombinedOutput()
		t.Logf("block %d:\n%s\n%s", i, b.script, out)
		if err != nil {
			t.Fatalf("docs/cli.md block %d failed: %v\n%s\n%s", i, err, b.script, out)
		}
	}
	if ran == 0 {
		t.Fatal("no block of docs/cli.md is marked to run")
	}
}
