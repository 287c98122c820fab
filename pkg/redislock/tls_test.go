package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/redisconn"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// TestTLSWithACLUser runs the lock over TLS as an ACL user, and checks that
// a wrong password and an untrusted certificate fail with clear errors.
func TestTLSWithACLUser(t *testing.T) {
	srv, caFile := redistest.StartTLS(t,
		"--user", "default", "off",
		"--user", "locker", "on", ">locker-secret", "~*", "&*", "+@all")
	ctx := testContext(t)
	connect := func(cfg redisconn.Config) (*redislock.Client, error) {
		rdb, err := cfg.Client()
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = rdb.Close() })
		return redislock.New(rdb, redislock.Options{RetryFallback: 100 * time.Millisecond})
	}
	url := "rediss://" + srv.Addr

	c, err := connect(redisconn.Config{URL: url, Username: "locker", Password: "locker-secret", CAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := newMutex(t, c, lockName(t), nil)
	mustUnlock(t, ctx, mustLock(t, ctx, m))

	for _, tc := range []struct {
		name string
		cfg  redisconn.Config
		want string
	}{
		{"wrong password", redisconn.Config{URL: url, Username: "locker", Password: "nope", CAFile: caFile}, "WRONGPASS"},
		{"untrusted certificate", redisconn.Config{URL: url, Username: "locker", Password: "locker-secret"}, "certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad, err := connect(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer bad.Close()
			_, err = newMutex(t, bad, lockName(t), nil).Lock(context.Background())
			wantErr(t, err, redislock.ErrUnavailable)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "locker-secret") {
				t.Fatalf("error %q leaks the password", err)
			}
		})
	}
}
