// Command manager runs the DistributedLock controller.
//
// Redis is named by --redis-url (or $REDIS_URL), --redis-sentinel-addrs with
// --redis-sentinel-master, or --redis-cluster-addrs. Credentials come from
// $REDIS_USERNAME and $REDIS_PASSWORD, which a Secret supplies; they are
// never flags and never logged.
package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/redis/go-redis/v9"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/redisconn"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func main() {
	var (
		metricsAddr, probeAddr string
		leaderElect            bool
		redisCfg               redisconn.Config
		sentinels, cluster     string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 turns it off.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz probes.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader among manager replicas with a Lease, so a standby can take over.")
	flag.StringVar(&redisCfg.URL, "redis-url", os.Getenv("REDIS_URL"), "Redis URL, redis://host:port/db or rediss:// for TLS. Default: $REDIS_URL.")
	flag.StringVar(&sentinels, "redis-sentinel-addrs", "", "Comma-separated Sentinel addresses, instead of --redis-url.")
	flag.StringVar(&redisCfg.SentinelMaster, "redis-sentinel-master", "", "The master name the Sentinels watch.")
	flag.StringVar(&cluster, "redis-cluster-addrs", "", "Comma-separated Redis Cluster node addresses, instead of --redis-url.")
	flag.BoolVar(&redisCfg.TLS, "redis-tls", false, "Use TLS with Sentinel or Cluster addresses (rediss:// implies it for a URL).")
	flag.StringVar(&redisCfg.CAFile, "redis-ca-file", "", "PEM file of CAs to trust for Redis TLS, such as a mounted Secret's ca.crt.")
	var keys controllers.KeyPolicy
	flag.Func("shared-key", "KEY=NAMESPACE[,NAMESPACE...]: let locks in those namespaces (* for all) use a key outside their own <namespace>/..., to share it across namespaces, with another cluster or with in-pod clients. Repeat for more keys.", keys.Share)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	redisCfg.SentinelAddrs = redisconn.SplitList(sentinels)
	redisCfg.ClusterAddrs = redisconn.SplitList(cluster)
	redisCfg.Username = os.Getenv("REDIS_USERNAME")
	redisCfg.Password = os.Getenv("REDIS_PASSWORD")
	rdb, err := redisCfg.Client()
	if err != nil {
		log.Error(err, "cannot configure Redis")
		os.Exit(1)
	}
	defer rdb.Close()
	log.Info("using Redis", "target", redisCfg.Target())

	scheme := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(scheme))
	must(locksv1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              "lockwarden-manager.lockwarden.dev",
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		os.Exit(1)
	}

	libMetrics := redislock.NewMetrics()
	must(ctrlmetrics.Registry.Register(libMetrics))
	metrics, err := controllers.NewMetrics(ctrlmetrics.Registry)
	must(err)
	locks := controllers.NewLockClients(rdb, ctrl.Log, libMetrics)
	defer locks.Close()
	reconciler := &controllers.DistributedLockReconciler{
		Client:   mgr.GetClient(),
		Recorder: mgr.GetEventRecorderFor("lockwarden"),
		Locks:    locks,
		Metrics:  metrics,
		Keys:     keys,
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		log.Error(err, "cannot set up the controller")
		os.Exit(1)
	}
	must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	must(mgr.AddReadyzCheck("redis", redisReachable(rdb)))

	log.Info("starting the manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "the manager stopped")
		os.Exit(1)
	}
}

// redisReachable fails readiness while Redis does not answer a PING.
func redisReachable(rdb redis.UniversalClient) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}
}

func must(err error) {
	if err != nil {
		ctrl.Log.Error(err, "setup failed")
		os.Exit(1)
	}
}
