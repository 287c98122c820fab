package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
