package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"both passwords", map[string]string{"REDIS_URL": "redis://r", "REDIS_PASSWORD": "x", "REDIS_PASSWORD_FILE": file}, "not both"},
		{"missing file", map[string]string{"REDIS_URL": "redis://r", "REDIS_PASSWORD_FILE": file + ".absent"}, "REDIS_PASSWORD_FILE"},
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
