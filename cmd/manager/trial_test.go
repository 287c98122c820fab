package main

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/lockwarden/lockwarden/internal/redisconn"
)

// TestTrialRedis builds config/trial-redis and runs its Redis as the pod
// would: the container's own command, with its mounted files (redis.conf
// from the ConfigMap, the password from the Secret) in a temporary
// directory, against the real redis-server. It checks Redis demands the
// password and keeps every write on disk, and that the manager, configured
// from its Deployment's environment as in the cluster, reaches it through
// the Service.
func TestTrialRedis(t *testing.T) {
	var (
		manager, redisDeploy appsv1.Deployment
		svc                  corev1.Service
		conf                 string
	)
	for _, obj := range kustomizeBuild(t, filepath.Join("..", "..", "config", "trial-redis")) {
		switch {
		case obj.GetKind() == "Deployment" && obj.GetName() == "lockwarden-controller-manager":
			strictFrom(t, obj, &manager)
		case obj.GetKind() == "Deployment" && obj.GetName() == "lockwarden-trial-redis":
			strictFrom(t, obj, &redisDeploy)
		case obj.GetKind() == "Service" && obj.GetName() == "lockwarden-trial-redis":
			strictFrom(t, obj, &svc)
		case obj.GetKind() == "ConfigMap" && strings.HasPrefix(obj.GetName(), "lockwarden-trial-redis"):
			var cm corev1.ConfigMap
			strictFrom(t, obj, &cm)
			conf = cm.Data["redis.conf"]
		}
	}
	if manager.Name == "" || redisDeploy.Name == "" || svc.Name == "" || conf == "" {
		t.Fatal("config/trial-redis lacks the manager, the Redis Deployment, its Service or its redis.conf")
	}

	// The manager's URL names the Service and its port, and the Service
	// reaches the Redis container's port.
	mc := manager.Spec.Template.Spec.Containers[0]
	var redisURL string
	for _, e := range mc.Env {
		if e.Name == envRedisURL {
			redisURL = e.Value
		}
	}
	u, err := url.Parse(redisURL)
	if err != nil || u.Hostname() != svc.Name {
		t.Fatalf("the manager's %s = %q does not name the Service %s", envRedisURL, redisURL, svc.Name)
	}
	pod := redisDeploy.Spec.Template.Spec
	rc := pod.Containers[0]
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(redisDeploy.Spec.Template.Labels)) ||
		len(svc.Spec.Ports) != 1 || strconv.Itoa(int(svc.Spec.Ports[0].Port)) != u.Port() ||
		len(rc.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != rc.Ports[0].Name {
		t.Fatalf("the Service %+v does not reach Redis's port %+v at %s", svc.Spec, rc.Ports, redisURL)
	}

	// The pod's files, laid out under a temporary root: Redis listens on a
	// free port and keeps its data in the temporary directory.
	root := t.TempDir()
	const password = "trial-password-7f3"
	port := strconv.Itoa(freePort(t))
	var script string
	if len(rc.Command) == 3 && rc.Command[0] == "sh" && rc.Command[1] == "-c" {
		script = rc.Command[2]
	} else {
		t.Fatalf("the Redis container's command %q is not sh -c SCRIPT", rc.Command)
	}
	var mounts []string // mount path, its place under root: one pass, so no path is rewritten twice
	for _, m := range rc.VolumeMounts {
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, v := range pod.Volumes {
			switch {
			case v.Name != m.Name:
			case v.ConfigMap != nil:
				conf = strings.ReplaceAll(conf, "port 6379", "port "+port)
				conf = strings.ReplaceAll(conf, "dir /data", "dir "+filepath.Join(root, "data"))
				writeFile(t, filepath.Join(dir, "redis.conf"), conf)
			case v.Secret != nil:
				if v.Secret.SecretName != "lockwarden-redis" || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "password" {
					t.Fatalf("Redis's password volume %+v is not the password key of the lockwarden-redis Secret", v.Secret)
				}
				writeFile(t, filepath.Join(dir, v.Secret.Items[0].Path), password)
			}
		}
		mounts = append(mounts, m.MountPath+"/", dir+"/")
	}
	script = strings.NewReplacer(mounts...).Replace(script)
	if !strings.Contains(conf, "port "+port) {
		t.Fatalf("redis.conf does not set port 6379, the Service's target:\n%s", conf)
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = root
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server output:\n%s", out)
		}
	})

	// The manager's Redis configuration, from the environment its
	// Deployment gives it, the host swapped for the local server's.
	passwordFile := filepath.Join(root, "manager-password")
	writeFile(t, passwordFile, password)
	env := map[string]string{
		envRedisURL:          strings.Replace(redisURL, u.Host, net.JoinHostPort("127.0.0.1", port), 1),
		envRedisPasswordFile: passwordFile,
	}
	var cfg redisconn.Config
	if err := redisFromEnv(&cfg, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	rdb, err := cfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the manager cannot reach the trial Redis: %v", rdb.Ping(ctx).Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for param, want := range map[string]string{"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"} {
		if got, err := rdb.ConfigGet(ctx, param).Result(); err != nil || got[param] != want {
			t.Errorf("CONFIG GET %s = %v (%v), want %s", param, got, err, want)
		}
	}

	// Without the password Redis refuses to serve.
	anon := redisconn.Config{URL: "redis://" + net.JoinHostPort("127.0.0.1", port)}
	anonClient, err := anon.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer anonClient.Close()
	if err := anonClient.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("PING without the password: %v, want NOAUTH", err)
	}
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort is a loopback port free at the time of asking.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
