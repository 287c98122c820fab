package redislock_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

const testPodUID = "3f1c8a52-9d7e-4b6a-8c1d-2e5f7a9b0c4d"

// setPodEnv sets a complete, valid environment for FromEnv, with REDIS_URL.
func setPodEnv(t *testing.T, url string) {
	for _, name := range []string{redislock.EnvRedisSentinelAddrs, redislock.EnvRedisSentinelMaster, redislock.EnvRedisClusterAddrs,
		redislock.EnvRedisUsername, redislock.EnvRedisPassword, redislock.EnvRedisPasswordFile, redislock.EnvRedisTLS, redislock.EnvRedisCAFile} {
		t.Setenv(name, "")
	}
	t.Setenv(redislock.EnvRedisURL, url)
	t.Setenv(redislock.EnvPodUID, testPodUID)
	t.Setenv(redislock.EnvPodName, "api-7d9f")
	t.Setenv(redislock.EnvPodNamespace, "shop")
}

func TestFromEnv(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret")
	setPodEnv(t, "redis://"+srv.Addr)
	secret := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(redislock.EnvRedisPasswordFile, secret) // as a mounted Secret

	c, err := redislock.FromEnv(redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if pod := c.Pod(); pod != (redislock.Pod{UID: testPodUID, Name: "api-7d9f", Namespace: "shop"}) {
		t.Fatalf("Pod() = %+v", pod)
	}
	if owner := c.NewOwner(); !strings.HasPrefix(string(owner), testPodUID+":") {
		t.Fatalf("owner %s does not start with the pod UID", owner)
	}
	ctx := testContext(t)
	m := newMutex(t, c, redislock.LockName("shop", "leader"), nil)
	held := mustLock(t, ctx, m)
	info := inspect(t, c, "shop/leader")
	if len(info.Holders) != 1 || info.Holders[0].Owner != held.Owner() || !strings.HasPrefix(string(held.Owner()), testPodUID+":") {
		t.Fatalf("holders = %+v", info.Holders)
	}
	mustUnlock(t, ctx, held)
}

func TestFromEnvTLS(t *testing.T) {
	srv, caFile := redistest.StartTLS(t)
	setPodEnv(t, "rediss://"+srv.Addr)
	t.Setenv(redislock.EnvRedisCAFile, caFile)
	c, err := redislock.FromEnv(redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := newMutex(t, c, "tls-lock", nil)
	mustUnlock(t, testContext(t), mustLock(t, testContext(t), m))

	// Without the CA, the server's certificate is not trusted.
	t.Setenv(redislock.EnvRedisCAFile, "")
	untrusted, err := redislock.FromEnv(redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer untrusted.Close()
	_, err = newMutex(t, untrusted, "tls-lock", nil).Lock(context.Background())
	wantErr(t, err, redislock.ErrUnavailable)
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("error %q does not say the certificate is untrusted", err)
	}
}

func TestFromEnvNamesWhatIsWrong(t *testing.T) {
	cases := []struct {
		name, variable, value, want string
	}{
		{"no pod UID", redislock.EnvPodUID, "", "POD_UID"},
		{"malformed pod UID", redislock.EnvPodUID, "not-a-uid", "POD_UID"},
		{"no pod name", redislock.EnvPodName, "", "POD_NAME"},
		{"no namespace", redislock.EnvPodNamespace, "", "POD_NAMESPACE"},
		{"no Redis", redislock.EnvRedisURL, "", "REDIS_URL"},
		{"not a Redis URL", redislock.EnvRedisURL, "http://example", "REDIS_URL"},
		{"unreadable password file", redislock.EnvRedisPasswordFile, "/nonexistent/password", "REDIS_PASSWORD_FILE"},
		{"bad TLS flag", redislock.EnvRedisTLS, "maybe", "REDIS_TLS"},
		{"sentinel without master", redislock.EnvRedisSentinelAddrs, "127.0.0.1:26379", "REDIS_SENTINEL_MASTER"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setPodEnv(t, "redis://127.0.0.1:6379")
			if tc.variable == redislock.EnvRedisSentinelAddrs {
				t.Setenv(redislock.EnvRedisURL, "")
			}
			t.Setenv(tc.variable, tc.value)
			c, err := redislock.FromEnv(redislock.Options{})
			if err == nil {
				_ = c.Close()
				t.Fatal("FromEnv accepted the environment")
			}
			if c != nil {
				t.Fatal("FromEnv returned a client with its error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name %s", err, tc.want)
			}
		})
	}
}
