// Command manager runs the DistributedLock controller.
//
// Redis is named by $REDIS_URL, --redis-sentinel-addrs with
// --redis-sentinel-master, or --redis-cluster-addrs. The URL and the
// credentials come from the environment ($REDIS_URL, $REDIS_USERNAME, and
// $REDIS_PASSWORD or $REDIS_PASSWORD_FILE), which a Secret supplies. They
// are never flags, so no flag default or usage text can print them, and
// they are never logged. So are the Sentinels' own credentials, when they
// require any ($REDIS_SENTINEL_USERNAME, and $REDIS_SENTINEL_PASSWORD or
// $REDIS_SENTINEL_PASSWORD_FILE).
//
// Every line it writes is JSON, its libraries' included (see routeLogs).
//
// `manager --uninstall` does not run the controller: it deletes every
// DistributedLock before lockwarden is removed (see uninstaller), as the
// chart's pre-delete hook runs it. `manager --check` does not run it
// either: it checks what the manager needs, as `helm test` runs it (see
// runCheck).
//
// --watch-namespaces runs it in namespaced mode: it watches, caches and
// writes only the DistributedLocks and pods of the namespaces listed.
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	// Mozilla's roots, for Redis TLS when the image has no CA bundle (make
	// image builds on an empty base); unused where the system has roots.
	_ "golang.org/x/crypto/x509roots/fallback"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redisconn"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// version is the manager's version, set at build time by the Makefile with
// -ldflags "-X main.version=..."; a plain `go build` leaves "dev".
var version = "dev"

// gracefulShutdownTimeout bounds how long the manager waits for its
// controller and runnables to stop after SIGTERM. config/manager's
// terminationGracePeriodSeconds must exceed it, or the kubelet kills the
// manager before it has released its leader-election Lease.
const gracefulShutdownTimeout = 30 * time.Second

// Environment variables naming Redis and its credentials, as
// redislock.FromEnv reads them.
const (
	envRedisURL          = "REDIS_URL"
	envRedisUsername     = "REDIS_USERNAME"
	envRedisPassword     = "REDIS_PASSWORD"
	envRedisPasswordFile = "REDIS_PASSWORD_FILE"

	envSentinelUsername     = "REDIS_SENTINEL_USERNAME"
	envSentinelPassword     = "REDIS_SENTINEL_PASSWORD"
	envSentinelPasswordFile = "REDIS_SENTINEL_PASSWORD_FILE"
)

// options are the manager's flags.
type options struct {
	showVersion bool
	probeAddr   string

	// Metrics, served as the kubebuilder v4 scaffold serves them.
	metricsAddr      string
	metricsSecure    bool
	metricsCertDir   string
	metricsCertName  string
	metricsCertKey   string
	enableHTTP2      bool
	metricsLockNames bool

	leaderElect         bool
	lease, renew, retry time.Duration

	maxConcurrentReconciles int
	podLabelSelector        string
	watchNamespaces         string
	pprofAddr               string

	redisCfg           redisconn.Config
	sentinels, cluster string
	keys               controllers.KeyPolicy

	// --check: check Redis and the DistributedLock API, and exit.
	check bool

	// --uninstall: delete every DistributedLock and exit.
	uninstall        bool
	uninstallTimeout time.Duration
	uninstallLease   string
}

// bindFlags defines the manager's flags on fs, with their defaults.
func bindFlags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address of the Prometheus metrics endpoint; 0 turns it off.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS, only to callers the API server authenticates and authorizes for GET /metrics (the metrics-reader ClusterRole). false serves plain HTTP to anyone.")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-path", "", "Directory of the metrics server's certificate, reloaded when it changes; empty: a self-signed certificate made at start-up.")
	fs.StringVar(&o.metricsCertName, "metrics-cert-name", "tls.crt", "The certificate's file name in --metrics-cert-path.")
	fs.StringVar(&o.metricsCertKey, "metrics-cert-key", "tls.key", "The key's file name in --metrics-cert-path.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false, "Allow HTTP/2 on the metrics server. Off by default against the HTTP/2 Stream Cancellation and Rapid Reset CVEs.")
	fs.BoolVar(&o.metricsLockNames, "metrics-lock-names", false, "Label the lock metrics with each DistributedLock's name, not only its namespace. Anyone allowed to read the metrics then sees every tenant's lock names.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz probes.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader among manager replicas with a Lease, so a standby can take over.")
	// controller-runtime's defaults. Nobody renews the locks in Redis during
	// a failover, so lease duration, retry period and start-up together must
	// stay below every DistributedLock's leaseDuration - renewInterval (see
	// the README).
	fs.DurationVar(&o.lease, "leader-elect-lease-duration", 15*time.Second, "How long a standby waits after the leader's last renewal of the Lease before it takes over.")
	fs.DurationVar(&o.renew, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps retrying to renew the Lease before it gives up leading; below the lease duration.")
	fs.DurationVar(&o.retry, "leader-elect-retry-period", 2*time.Second, "How often candidates try to take or renew the Lease; below the renew deadline / 1.2.")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", controllers.DefaultMaxConcurrentReconciles, "How many keys the controller settles at once; reconciles of one key never overlap.")
	fs.StringVar(&o.podLabelSelector, "pod-label-selector", "", "Watch and cache only the pods with these labels (a label selector, such as lockwarden.dev/candidate=true), so memory follows the pods that take part in locks rather than every pod of the cluster. Every pod a lock selects or gates must then carry them: the controller sees no other pod. Empty: every pod.")
	fs.StringVar(&o.watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces: watch, cache and write DistributedLocks and pods only in these (namespaced mode; the manager then needs Roles in these namespaces only, no ClusterRole). A lock elsewhere is left alone, and so is a pod elsewhere even if a lock's key is shared with its namespace. Empty: every namespace.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", "Address to serve Go's pprof profiles on, such as 127.0.0.1:6060; empty turns it off.")
	fs.StringVar(&o.sentinels, "redis-sentinel-addrs", "", "Comma-separated Sentinel addresses, instead of $REDIS_URL.")
	fs.StringVar(&o.redisCfg.SentinelMaster, "redis-sentinel-master", "", "The master name the Sentinels watch.")
	fs.StringVar(&o.cluster, "redis-cluster-addrs", "", "Comma-separated Redis Cluster node addresses, instead of $REDIS_URL.")
	fs.BoolVar(&o.redisCfg.TLS, "redis-tls", false, "Use TLS with Sentinel or Cluster addresses (rediss:// implies it for a URL).")
	fs.StringVar(&o.redisCfg.CAFile, "redis-ca-file", "", "PEM file of CAs to trust for Redis TLS, such as a mounted Secret's ca.crt.")
	fs.BoolVar(&o.check, "check", false, "Do not run the controller: check that Redis accepts the configured credentials and that the DistributedLock API can be read (in --watch-namespaces, or cluster-wide), print each check's outcome, and exit 1 if one failed, saying which (the Helm chart's test, `helm test`).")
	fs.BoolVar(&o.uninstall, "uninstall", false, "Do not run the controller: delete every DistributedLock, let the leading manager release them, and exit (the Helm chart's pre-delete hook). A lock still there after --uninstall-timeout, or at once when no manager leads, loses its finalizer; its hold in Redis then expires with its lease.")
	fs.DurationVar(&o.uninstallTimeout, "uninstall-timeout", 2*time.Minute, "With --uninstall: how long the leading manager may take to release the locks.")
	fs.StringVar(&o.uninstallLease, "uninstall-lease", "", "With --uninstall: NAMESPACE/NAME of the managers' leader-election Lease, which tells whether a manager leads; empty: $POD_NAMESPACE/"+leaderElectionID+", or if that is unset, wait for --uninstall-timeout.")
	fs.Func("shared-key", "KEY=NAMESPACE[,NAMESPACE...]: let locks in those namespaces (* for all) use a key outside their own <namespace>/..., to share it across namespaces, with another cluster or with in-pod clients. Repeat for more keys.", o.keys.Share)
	return o
}

// allFlags defines every flag the manager takes, its own and its logger's:
// JSON, one object a line, with ISO 8601 times; --zap-log-level=debug (or a
// number, for client-go's klog verbosity) says more.
func allFlags(fs *flag.FlagSet) (*options, *zap.Options) {
	o := bindFlags(fs)
	zapOpts := &zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder}
	zapOpts.BindFlags(fs)
	return o, zapOpts
}

// validate refuses flag values the manager cannot run with, naming the
// flag, before it touches Redis or the API server.
func (o *options) validate() error {
	if o.maxConcurrentReconciles <= 0 {
		return fmt.Errorf("--max-concurrent-reconciles (%d) must be above 0", o.maxConcurrentReconciles)
	}
	if _, err := o.pods(); err != nil {
		return err
	}
	if _, err := o.namespaces(); err != nil {
		return err
	}
	return checkLeaderElection(o.lease, o.renew, o.retry)
}

// namespaces are --watch-namespaces' namespaces, nil for every namespace.
func (o *options) namespaces() ([]string, error) {
	list := redisconn.SplitList(o.watchNamespaces)
	seen := map[string]bool{}
	for _, ns := range list {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		if seen[ns] {
			return nil, fmt.Errorf("--watch-namespaces names %s twice", ns)
		}
		seen[ns] = true
	}
	return list, nil
}

// cacheOptions are the controller's cache settings (controllers.CacheOptions)
// restricted to --watch-namespaces, if given: the cache then lists and
// watches DistributedLocks and pods in those namespaces only, which the
// Roles of namespaced mode allow.
func cacheOptions(pods labels.Selector, namespaces []string) cache.Options {
	opts := controllers.CacheOptions(pods)
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// pods is the pod cache's filter from --pod-label-selector, nil for every
// pod.
func (o *options) pods() (labels.Selector, error) {
	if o.podLabelSelector == "" {
		return nil, nil
	}
	sel, err := labels.Parse(o.podLabelSelector)
	if err != nil {
		return nil, fmt.Errorf("--pod-label-selector %q is not a label selector: %w", o.podLabelSelector, err)
	}
	if sel.Empty() {
		return nil, nil
	}
	return sel, nil
}

// metricsServer is the metrics server's configuration. Secure, it serves
// HTTPS and asks the API server (TokenReview, SubjectAccessReview) whether
// each caller may GET /metrics, which the metrics-auth-role in config/rbac
// lets the manager ask.
func (o *options) metricsServer() metricsserver.Options {
	opts := metricsserver.Options{
		BindAddress:   o.metricsAddr,
		SecureServing: o.metricsSecure,
		CertDir:       o.metricsCertDir,
		CertName:      o.metricsCertName,
		KeyName:       o.metricsCertKey,
	}
	if !o.enableHTTP2 {
		opts.TLSOpts = append(opts.TLSOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	if o.metricsSecure {
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return opts
}

func main() {
	o, zapOpts := allFlags(flag.CommandLine)
	flag.Parse()
	if o.showVersion {
		fmt.Println(version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(zapOpts)))
	routeLogs(ctrl.Log)
	log := ctrl.Log.WithName("setup")
	log.Info("lockwarden manager", "version", version)
	if o.uninstall {
		os.Exit(runUninstall(o, log))
	}

	if err := o.validate(); err != nil {
		log.Error(err, "invalid flags")
		os.Exit(2)
	}
	redisCfg := o.redisCfg
	redisCfg.SentinelAddrs = redisconn.SplitList(o.sentinels)
	redisCfg.ClusterAddrs = redisconn.SplitList(o.cluster)
	if err := redisFromEnv(&redisCfg, os.Getenv); err != nil {
		log.Error(err, "cannot configure Redis")
		os.Exit(1)
	}
	rdb, err := redisCfg.Client()
	if err != nil {
		log.Error(err, "cannot configure Redis")
		os.Exit(1)
	}
	defer rdb.Close()
	log.Info("using Redis", "target", redisCfg.Target())
	namespaces, _ := o.namespaces() // validated above
	if o.check {
		os.Exit(runCheck(rdb, redisCfg.Target(), namespaces, log))
	}
	if len(namespaces) > 0 {
		log.Info("namespaced mode: watching only these namespaces", "namespaces", namespaces)
	}

	if limit, ok := setMemoryLimit(os.Getenv, cgroupMemoryFiles); ok {
		log.Info("set the Go memory limit below the container's", "GOMEMLIMIT", limit)
	}
	pods, _ := o.pods() // validated above

	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(locksv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cacheOptions(pods, namespaces),
		PprofBindAddress:       o.pprofAddr,
		Metrics:                o.metricsServer(),
		HealthProbeBindAddress: o.probeAddr,
		LeaderElection:         o.leaderElect,
		LeaderElectionID:       leaderElectionID,
		// In a pod, the Lease lives in the pod's namespace ($POD_NAMESPACE
		// from the downward API, else the ServiceAccount's); a manager run
		// outside the cluster names it with $POD_NAMESPACE.
		LeaderElectionNamespace:       os.Getenv("POD_NAMESPACE"),
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.lease,
		RenewDeadline:                 &o.renew,
		RetryPeriod:                   &o.retry,
		GracefulShutdownTimeout:       new(gracefulShutdownTimeout),
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		os.Exit(1)
	}

	libMetrics := redislock.NewMetrics()
	must(ctrlmetrics.Registry.Register(libMetrics))
	metrics, err := controllers.NewMetrics(ctrlmetrics.Registry, controllers.MetricsOptions{LockNames: o.metricsLockNames})
	must(err)
	locks := controllers.NewLockClients(rdb, ctrl.Log, libMetrics)
	defer locks.Close()
	reconciler := &controllers.DistributedLockReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor("lockwarden"),
		Locks:    locks,
		Metrics:  metrics,
		Keys:     o.keys,

		MaxConcurrentReconciles: o.maxConcurrentReconciles,
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		log.Error(err, "cannot set up the controller")
		os.Exit(1)
	}
	watch, err := newRedisWatch(rdb, ctrl.Log.WithName("redis"), ctrlmetrics.Registry)
	must(err)
	must(mgr.Add(watch))
	must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	must(mgr.AddReadyzCheck("redis-at-start", watch.readiness))
	must(ctrlmetrics.Registry.Register(newStatusMetrics(mgr.GetCache(), mgr.Elected(), o.metricsLockNames, ctrl.Log.WithName("metrics"))))

	log.Info("starting the manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "the manager stopped")
		os.Exit(1)
	}
}

// leaderElectionJitter is client-go's leaderelection.JitterFactor: a
// candidate waits up to 1.2 retry periods between tries, and client-go
// refuses a renew deadline that is not above that.
const leaderElectionJitter = 1.2

// checkLeaderElection applies client-go's rules for the election timings
// before the manager starts, so a bad combination fails with the flag names
// rather than deep in the election: the leader must give up (renew
// deadline) before a standby may take over (lease duration), and must get
// more than one jittered try (retry period) within the renew deadline.
func checkLeaderElection(lease, renew, retry time.Duration) error {
	switch {
	case lease <= 0 || renew <= 0 || retry <= 0:
		return errors.New("--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period must be positive")
	case renew >= lease:
		return fmt.Errorf("--leader-elect-renew-deadline (%v) must be below --leader-elect-lease-duration (%v), so the leader stops leading before a standby may take over", renew, lease)
	case time.Duration(leaderElectionJitter*float64(retry)) >= renew:
		return fmt.Errorf("--leader-elect-retry-period (%v) times %v must be below --leader-elect-renew-deadline (%v), so the leader gets to retry a failed renewal", retry, leaderElectionJitter, renew)
	}
	return nil
}

// redisFromEnv completes cfg from the environment as redislock.FromEnv
// does: the URL from REDIS_URL, the username from REDIS_USERNAME, and the
// password from REDIS_PASSWORD or the file REDIS_PASSWORD_FILE names (a
// mounted Secret key), not both; and the Sentinels' own credentials the
// same way from REDIS_SENTINEL_USERNAME and REDIS_SENTINEL_PASSWORD or
// REDIS_SENTINEL_PASSWORD_FILE. Errors never quote the URL.
func redisFromEnv(cfg *redisconn.Config, getenv func(string) string) error {
	cfg.URL = getenv(envRedisURL)
	cfg.Username = getenv(envRedisUsername)
	cfg.SentinelUsername = getenv(envSentinelUsername)
	if cfg.URL != "" && !strings.HasPrefix(cfg.URL, "redis://") && !strings.HasPrefix(cfg.URL, "rediss://") {
		return fmt.Errorf("%s must start with redis:// or rediss://", envRedisURL)
	}
	var err error
	if cfg.Password, err = secretFromEnv(getenv, envRedisPassword, envRedisPasswordFile); err != nil {
		return err
	}
	cfg.SentinelPassword, err = secretFromEnv(getenv, envSentinelPassword, envSentinelPasswordFile)
	return err
}

// secretFromEnv reads a secret from the variable direct, or from the file
// the variable file names, not both.
func secretFromEnv(getenv func(string) string, direct, file string) (string, error) {
	value, path := getenv(direct), getenv(file)
	if path == "" {
		return value, nil
	}
	if value != "" {
		return "", fmt.Errorf("set %s or %s, not both", direct, file)
	}
	secret, err := redisconn.ReadPasswordFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	return secret, nil
}

// runCheck runs `manager --check` and returns the exit code: 1 if a check
// failed.
func runCheck(rdb redis.UniversalClient, target string, namespaces []string, log logr.Logger) int {
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(locksv1.AddToScheme(scheme))
	api, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme})
	if err != nil {
		log.Error(err, "cannot create a client")
		return 1
	}
	c := &check{log: ctrl.Log.WithName("check"), rdb: rdb, target: target, api: api, namespaces: namespaces}
	if c.run(ctrl.SetupSignalHandler()) > 0 {
		return 1
	}
	return 0
}

// runUninstall runs `manager --uninstall` and returns the exit code.
func runUninstall(o *options, log logr.Logger) int {
	lease := types.NamespacedName{}
	switch ns := os.Getenv("POD_NAMESPACE"); {
	case o.uninstallLease != "":
		namespace, name, ok := strings.Cut(o.uninstallLease, "/")
		if !ok || namespace == "" || name == "" {
			log.Error(nil, "--uninstall-lease must be NAMESPACE/NAME", "value", o.uninstallLease)
			return 2
		}
		lease = types.NamespacedName{Namespace: namespace, Name: name}
	case ns != "":
		lease = types.NamespacedName{Namespace: ns, Name: leaderElectionID}
	}
	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(locksv1.AddToScheme(scheme))
	c, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme})
	if err != nil {
		log.Error(err, "cannot create a client")
		return 1
	}
	u := &uninstaller{client: c, log: ctrl.Log.WithName("uninstall"), lease: lease, timeout: o.uninstallTimeout, poll: time.Second, now: time.Now}
	if err := u.run(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "uninstall failed")
		return 1
	}
	return 0
}

func must(err error) {
	if err != nil {
		ctrl.Log.Error(err, "setup failed")
		os.Exit(1)
	}
}
