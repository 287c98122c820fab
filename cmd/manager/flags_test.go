package main

import (
	"crypto/tls"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redisconn"
)

func TestRedisFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}

	var cfg redisconn.Config
	if err := redisFromEnv(&cfg, env(map[string]string{
		"REDIS_URL": "rediss://r:6380/1", "REDIS_USERNAME": "lw", "REDIS_PASSWORD_FILE": file,
	})); err != nil {
		t.Fatal(err)
	}
	if cfg.URL != "rediss://r:6380/1" || cfg.Username != "lw" || cfg.Password != "from-file" {
		t.Fatalf("config = %+v", cfg)
	}

	// The Sentinels' own credentials, read the same way.
	cfg = redisconn.Config{}
	if err := redisFromEnv(&cfg, env(map[string]string{
		"REDIS_PASSWORD": "master", "REDIS_SENTINEL_USERNAME": "sentinel-user", "REDIS_SENTINEL_PASSWORD_FILE": file,
	})); err != nil {
		t.Fatal(err)
	}
	if cfg.Password != "master" || cfg.SentinelUsername != "sentinel-user" || cfg.SentinelPassword != "from-file" {
		t.Fatalf("config = %+v", cfg)
	}

	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"both passwords", map[string]string{"REDIS_URL": "redis://r", "REDIS_PASSWORD": "x", "REDIS_PASSWORD_FILE": file}, "not both"},
		{"missing file", map[string]string{"REDIS_URL": "redis://r", "REDIS_PASSWORD_FILE": file + ".absent"}, "REDIS_PASSWORD_FILE"},
		{"both Sentinel passwords", map[string]string{"REDIS_SENTINEL_PASSWORD": "x", "REDIS_SENTINEL_PASSWORD_FILE": file}, "REDIS_SENTINEL_PASSWORD or REDIS_SENTINEL_PASSWORD_FILE, not both"},
		{"wrong scheme", map[string]string{"REDIS_URL": "http://u:pw@r"}, "redis:// or rediss://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg redisconn.Config
			err := redisFromEnv(&cfg, env(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "pw") {
				t.Fatalf("error = %v, want one mentioning %q and no password", err, tc.want)
			}
		})
	}
}

func TestCheckLeaderElection(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		want                string // "" for valid
	}{
		{15 * s, 10 * s, 2 * s, ""}, // controller-runtime's defaults
		{8 * s, 5 * s, 1 * s, ""},
		{10 * s, 10 * s, 2 * s, "renew-deadline (10s) must be below --leader-elect-lease-duration (10s)"},
		{10 * s, 12 * s, 2 * s, "must be below --leader-elect-lease-duration"},
		{15 * s, 10 * s, 10 * s, "retry-period (10s) times 1.2 must be below --leader-elect-renew-deadline (10s)"},
		// Below the renew deadline but not by client-go's jitter factor.
		{15 * s, 10 * s, 9 * s, "times 1.2"},
		{0, 10 * s, 2 * s, "must be positive"},
		{15 * s, 10 * s, -s, "must be positive"},
	} {
		err := checkLeaderElection(tc.lease, tc.renew, tc.retry)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v/%v/%v: unexpected error %v", tc.lease, tc.renew, tc.retry, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v/%v/%v: error %v, want one containing %q", tc.lease, tc.renew, tc.retry, err, tc.want)
		}
	}
}

// The manager refuses bad timings at start-up, before it touches Redis or
// the API server, with the flag names in the message.
func TestLeaderElectionFlagsRefused(t *testing.T) {
	out, code := runManagerCode(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"},
		"--leader-elect", "--leader-elect-lease-duration=5s", "--leader-elect-renew-deadline=6s")
	if code != 2 || !strings.Contains(out, "--leader-elect-renew-deadline (6s) must be below --leader-elect-lease-duration (5s)") {
		t.Fatalf("exit code %d, output:\n%s", code, out)
	}
}

// parseFlags parses args as the manager's command line.
func parseFlags(t *testing.T, args ...string) *options {
	t.Helper()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	o := bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

// By default metrics are served as the kubebuilder v4 scaffold serves them:
// HTTPS on :8443 behind the API server's authentication and authorization,
// without HTTP/2, and without lock names.
func TestMetricsFlags(t *testing.T) {
	o := parseFlags(t)
	opts := o.metricsServer()
	if !opts.SecureServing || opts.FilterProvider == nil || opts.BindAddress != ":8443" || o.metricsLockNames {
		t.Fatalf("default metrics server: secure %v, filter set %v, address %q, lock names %v; want HTTPS with authn/authz on :8443, no lock names",
			opts.SecureServing, opts.FilterProvider != nil, opts.BindAddress, o.metricsLockNames)
	}
	tlsCfg := &tls.Config{NextProtos: []string{"h2"}}
	for _, f := range opts.TLSOpts {
		f(tlsCfg)
	}
	if slices.Contains(tlsCfg.NextProtos, "h2") {
		t.Errorf("HTTP/2 offered by default: %v", tlsCfg.NextProtos)
	}

	o = parseFlags(t, "--metrics-secure=false", "--metrics-bind-address=0", "--enable-http2",
		"--metrics-cert-path=/certs", "--metrics-cert-name=c.pem", "--metrics-cert-key=k.pem", "--metrics-lock-names")
	opts = o.metricsServer()
	if opts.SecureServing || opts.FilterProvider != nil || len(opts.TLSOpts) != 0 || opts.BindAddress != "0" ||
		opts.CertDir != "/certs" || opts.CertName != "c.pem" || opts.KeyName != "k.pem" || !o.metricsLockNames {
		t.Fatalf("flags not applied: %+v, lock names %v", opts, o.metricsLockNames)
	}
}

func TestMaxConcurrentReconciles(t *testing.T) {
	if o := parseFlags(t); o.maxConcurrentReconciles != controllers.DefaultMaxConcurrentReconciles || o.validate() != nil {
		t.Fatalf("default: %d (%v), want %d", o.maxConcurrentReconciles, o.validate(), controllers.DefaultMaxConcurrentReconciles)
	}
	if o := parseFlags(t, "--max-concurrent-reconciles=16"); o.maxConcurrentReconciles != 16 || o.validate() != nil {
		t.Fatalf("--max-concurrent-reconciles=16: %d (%v)", o.maxConcurrentReconciles, o.validate())
	}
	for _, n := range []string{"0", "-1"} {
		err := parseFlags(t, "--max-concurrent-reconciles="+n).validate()
		if err == nil || !strings.Contains(err.Error(), "--max-concurrent-reconciles ("+n+") must be above 0") {
			t.Errorf("--max-concurrent-reconciles=%s: error %v", n, err)
		}
	}
	// The binary refuses it at start-up, before Redis or the API server.
	out, code := runManagerCode(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "--max-concurrent-reconciles=0")
	if code != 2 || !strings.Contains(out, "--max-concurrent-reconciles (0) must be above 0") {
		t.Fatalf("exit code %d, output:\n%s", code, out)
	}
}

func TestPodLabelSelector(t *testing.T) {
	if sel, err := parseFlags(t).pods(); sel != nil || err != nil {
		t.Fatalf("default: %v, %v; want every pod", sel, err)
	}
	sel, err := parseFlags(t, "--pod-label-selector=lockwarden.dev/candidate=true,tier!=web").pods()
	if err != nil || sel.String() != "lockwarden.dev/candidate=true,tier!=web" {
		t.Fatalf("selector %v, %v", sel, err)
	}
	err = parseFlags(t, "--pod-label-selector=a==b==c").validate()
	if err == nil || !strings.Contains(err.Error(), `--pod-label-selector "a==b==c" is not a label selector`) {
		t.Fatalf("error %v", err)
	}
	out, code := runManagerCode(t, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "--pod-label-selector=a==b==c")
	if code != 2 || !strings.Contains(out, "is not a label selector") {
		t.Fatalf("exit code %d, output:\n%s", code, out)
	}
}
