package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// When Redis fails, each lock of the key gets one Warning Event saying so,
// besides its Ready condition, however many times the key is retried
// meanwhile; once Redis answers again the lock is Ready.
func TestRedisOutageIsAWarningEventOnEachLock(t *testing.T) {
	cut := redistest.StartProxy(t, redisAddr)
	ns := newNamespace(t)
	startManagerOn(t, managerConfig{redisAddr: cut.Addr, namespaces: []string{ns}})
	cut.Cut()
	lock := createLock(t, ns, "outage", "app")

	ready := func() *metav1.Condition {
		return meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
	}
	eventually(t, "Ready=False RedisUnavailable", func() bool {
		c := ready()
		return c != nil && c.Status == "False" && c.Reason == "RedisUnavailable"
	})
	warnings := func() []corev1.Event {
		var events corev1.EventList
		if err := k8s.List(context.Background(), &events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []corev1.Event
		for _, e := range events.Items {
			if e.InvolvedObject.Name == lock.Name && e.Type == corev1.EventTypeWarning && e.Reason == "RedisUnavailable" {
				out = append(out, e)
			}
		}
		return out
	}
	eventually(t, "a RedisUnavailable Warning Event on the lock", func() bool { return len(warnings()) > 0 })
	// Retried after 0.5, 1, 2 and 4 s: still one Event, counted once.
	time.Sleep(5 * time.Second)
	if ws := warnings(); len(ws) != 1 || ws[0].Count > 1 {
		t.Errorf("Warning Events during one outage: %d, counts %v; want one, once", len(ws), counts(ws))
	}
	cut.Heal()
	eventually(t, "Ready=True once Redis answers", func() bool {
		c := ready()
		return c != nil && c.Status == "True"
	})
}

// A Redis user the lock scripts may not run as (one made from the library's
// MinimalACL before its scripts ran HMGET and ZRANK) is shown on the lock as
// Redis failing, with its Warning Event, rather than failing every
// reconcile with nothing on the lock to say so.
func TestARedisUserWithoutTheScriptsCommandsShowsOnTheLock(t *testing.T) {
	admin := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	user := "older-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	args := []any{"acl", "setuser", user, "on", ">pw"}
	for _, rule := range strings.Fields(strings.NewReplacer("+hmget ", "", "+zrank ", "").Replace(redislock.MinimalACL)) {
		args = append(args, rule)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, Username: user, Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })

	ns := newNamespace(t)
	startManagerOn(t, managerConfig{rdb: rdb, namespaces: []string{ns}})
	createPod(t, ns, "a", "app")
	lock := createLock(t, ns, "acl", "app")
	eventually(t, "Ready=False RedisUnavailable", func() bool {
		c := meta.FindStatusCondition(getLock(t, lock).Status.Conditions, locksv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "RedisUnavailable"
	})
	assertEvents(t, ns, "RedisUnavailable")
	if inspect(t, ns+"/acl").Held() {
		t.Fatal("the key was taken by a client Redis refused")
	}
}

func counts(events []corev1.Event) []int32 {
	var out []int32
	for _, e := range events {
		out = append(out, e.Count)
	}
	return out
}
