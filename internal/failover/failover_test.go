package failover_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lockwarden/lockwarden/internal/envtestassets"
	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// client-go's default timings, and the same lease for lockwarden.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
	electionName  = "failover-bench"
)

// Environment of a child process that runs one elector.
const (
	envChild      = "FAILOVER_CHILD" // "lockwarden" or "client-go"
	envRedis      = "FAILOVER_REDIS"
	envKubeconfig = "FAILOVER_KUBECONFIG"
)

// TestMain runs an elector instead of the tests in a child process, so the
// benchmark can SIGTERM or SIGKILL a leader.
func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "lockwarden":
		os.Exit(runLockwardenChild())
	case "client-go":
		os.Exit(runClientGoChild())
	}
	os.Exit(m.Run())
}

// Each child prints "LEADING" when its term starts, and releases on SIGTERM.
func runLockwardenChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	c, err := redislock.New(rdb, redislock.Options{WatchdogLease: leaseDuration})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	err = c.RunElection(ctx, redislock.Election{Name: electionName, OnStartedLeading: func(ctx context.Context, _ redislock.Term) {
		fmt.Println("LEADING")
		<-ctx.Done()
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func runClientGoChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(envKubeconfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	elector, err := clientGoElector(cfg, func(ctx context.Context) {
		fmt.Println("LEADING")
		<-ctx.Done()
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	elector.Run(ctx)
	return 0
}

func clientGoElector(cfg *rest.Config, lead func(context.Context)) (*leaderelection.LeaderElector, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, "default", electionName, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())})
	if err != nil {
		return nil, err
	}
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		ReleaseOnCancel: true,
		Callbacks:       leaderelection.LeaderCallbacks{OnStartedLeading: lead, OnStoppedLeading: func() {}},
	})
}

// child is a running elector process.
type child struct {
	cmd     *exec.Cmd
	leading chan struct{}
}

func startChild(b *testing.B, kind string, env ...string) *child {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, envChild+"="+kind)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &child{cmd: cmd, leading: make(chan struct{})}
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if scanner.Text() == "LEADING" {
				close(c.leading)
			}
		}
	}()
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

func (c *child) waitLeading(b *testing.B, what string) time.Time {
	b.Helper()
	select {
	case <-c.leading:
		return time.Now()
	case <-time.After(2 * leaseDuration):
		b.Fatalf("%s never led", what)
		return time.Time{}
	}
}

// takeovers measures, for one kind of elector, the standby's takeover after
// a graceful stop (SIGTERM) and after a hard kill (SIGKILL) of the leader.
func takeovers(b *testing.B, kind string, env ...string) (graceful, hardKill time.Duration) {
	leader := startChild(b, kind, env...)
	leader.waitLeading(b, kind+" leader")
	standby := startChild(b, kind, env...)
	time.Sleep(3 * retryPeriod) // the standby is campaigning

	stopped := time.Now()
	_ = leader.cmd.Process.Signal(syscall.SIGTERM)
	graceful = standby.waitLeading(b, kind+" standby after a graceful stop").Sub(stopped)

	next := startChild(b, kind, env...)
	time.Sleep(3 * retryPeriod)
	killed := time.Now()
	_ = standby.cmd.Process.Kill()
	hardKill = next.waitLeading(b, kind+" standby after SIGKILL").Sub(killed)
	_ = next.cmd.Process.Signal(syscall.SIGTERM)
	_ = next.cmd.Wait()
	return graceful, hardKill
}

// countingTransport counts the API requests of client-go's elector.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.next.RoundTrip(r)
}

// commandCounter counts the Redis commands of lockwarden's elector.
type commandCounter struct{ n *atomic.Int64 }

func (commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// steadyRequests runs one elector in-process, leading alone, and returns
// its requests per minute over the window, counted from one renewal
// interval after the term starts (so one-time script loads do not count).
func steadyRequests(b *testing.B, window time.Duration, run func(ctx context.Context, count *atomic.Int64, leading chan<- struct{})) float64 {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var count atomic.Int64
	leading := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, &count, leading)
	}()
	<-leading
	time.Sleep(leaseDuration / 3)
	before := count.Load()
	time.Sleep(window)
	n := count.Load() - before
	cancel()
	<-done
	return float64(n) / window.Minutes()
}

func BenchmarkFailover(b *testing.B) {
	assets, err := envtestassets.Dir(context.Background(), filepath.Join("..", ".."), os.Stderr)
	if err != nil {
		b.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	user, err := env.AddUser(envtest.User{Name: "bench", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		b.Fatal(err)
	}
	kubeconfigFile := filepath.Join(b.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfigFile, kubeconfig, 0o600); err != nil {
		b.Fatal(err)
	}
	srv := redistest.Start(b)

	for range b.N {
		lwGraceful, lwKill := takeovers(b, "lockwarden", envRedis+"="+srv.Addr)
		cgGraceful, cgKill := takeovers(b, "client-go", envKubeconfig+"="+kubeconfigFile)

		window := 4 * leaseDuration / 3 // four lockwarden renewals, ten client-go retries
		lwRate := steadyRequests(b, window, func(ctx context.Context, count *atomic.Int64, leading chan<- struct{}) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			rdb.AddHook(commandCounter{count})
			c, err := redislock.New(rdb, redislock.Options{WatchdogLease: leaseDuration})
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			_ = c.RunElection(ctx, redislock.Election{Name: electionName + "-steady", OnStartedLeading: func(ctx context.Context, _ redislock.Term) {
				close(leading)
				<-ctx.Done()
			}})
		})
		cgRate := steadyRequests(b, window, func(ctx context.Context, count *atomic.Int64, leading chan<- struct{}) {
			counted := rest.CopyConfig(cfg)
			counted.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt, count} })
			elector, err := clientGoElector(counted, func(ctx context.Context) {
				close(leading)
				<-ctx.Done()
			})
			if err != nil {
				b.Error(err)
				return
			}
			elector.Run(ctx)
		})

		b.ReportMetric(float64(lwGraceful.Milliseconds()), "lockwarden-graceful-ms")
		b.ReportMetric(float64(cgGraceful.Milliseconds()), "client-go-graceful-ms")
		b.ReportMetric(lwKill.Seconds(), "lockwarden-sigkill-s")
		b.ReportMetric(cgKill.Seconds(), "client-go-sigkill-s")
		b.ReportMetric(lwRate, "lockwarden-redis-requests/min")
		b.ReportMetric(cgRate, "client-go-api-requests/min")
		b.Logf("\n| leader election, lease %v | lockwarden (Redis) | client-go (Lease, %v/%v/%v) | ratio |\n|---|---|---|---|\n"+
			"| takeover after a graceful stop | %v | %v | %.0f× faster |\n"+
			"| takeover after SIGKILL of the leader | %v | %v | %.2f× |\n"+
			"| requests per minute while leading | %.1f Redis | %.1f API | %.1f× fewer |",
			leaseDuration, leaseDuration, renewDeadline, retryPeriod,
			lwGraceful.Round(time.Millisecond), cgGraceful.Round(time.Millisecond), float64(cgGraceful)/float64(lwGraceful),
			lwKill.Round(10*time.Millisecond), cgKill.Round(10*time.Millisecond), float64(cgKill)/float64(lwKill),
			lwRate, cgRate, cgRate/lwRate)
	}
}
