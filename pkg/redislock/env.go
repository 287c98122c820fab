package redislock

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/lockwarden/lockwarden/internal/redisconn"
)

// Environment variables FromEnv reads. Set the Redis ones from a Secret and
// the pod ones from the downward API:
//
//	env:
//	- name: REDIS_URL
//	  valueFrom: {secretKeyRef: {name: lockwarden-redis, key: url}}
//	- name: REDIS_PASSWORD
//	  valueFrom: {secretKeyRef: {name: lockwarden-redis, key: password, optional: true}}
//	- name: POD_UID
//	  valueFrom: {fieldRef: {fieldPath: metadata.uid}}
//	- name: POD_NAME
//	  valueFrom: {fieldRef: {fieldPath: metadata.name}}
//	- name: POD_NAMESPACE
//	  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
const (
	EnvRedisURL            = "REDIS_URL"             // redis:// or rediss:// (TLS)
	EnvRedisSentinelAddrs  = "REDIS_SENTINEL_ADDRS"  // comma-separated, instead of REDIS_URL
	EnvRedisSentinelMaster = "REDIS_SENTINEL_MASTER" // the master name, with REDIS_SENTINEL_ADDRS
	EnvRedisClusterAddrs   = "REDIS_CLUSTER_ADDRS"   // comma-separated, instead of REDIS_URL
	EnvRedisUsername       = "REDIS_USERNAME"        // optional ACL user
	EnvRedisPassword       = "REDIS_PASSWORD"        // optional
	EnvRedisPasswordFile   = "REDIS_PASSWORD_FILE"   // optional: a mounted Secret file, instead of REDIS_PASSWORD
	EnvRedisTLS            = "REDIS_TLS"             // "true": TLS for Sentinel or Cluster addresses
	EnvRedisCAFile         = "REDIS_CA_FILE"         // optional PEM CA bundle for TLS
	EnvPodUID              = "POD_UID"
	EnvPodName             = "POD_NAME"
	EnvPodNamespace        = "POD_NAMESPACE"
)

// Pod identifies the pod a client runs in.
type Pod struct {
	UID, Name, Namespace string
}

// LockName is the Redis lock name of the DistributedLock namespace/name
// when its spec sets no key: "<namespace>/<name>".
func LockName(namespace, name string) string { return namespace + "/" + name }

var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// FromEnv returns a Client for code running in a pod: Redis from the REDIS_*
// variables, and the pod from POD_UID, POD_NAME and POD_NAMESPACE. The
// client's ID is the pod UID, so its owner IDs are "<pod UID>:<n>" and the
// controller shows its holds in DistributedLock status and releases them
// when the pod terminates. opts.ID is ignored. A missing or malformed
// variable is an error that names it; no half-configured Client is
// returned. Close also closes the Redis connection FromEnv opened.
func FromEnv(opts Options) (*Client, error) {
	pod, err := podFromEnv()
	if err != nil {
		return nil, err
	}
	cfg, err := redisFromEnv()
	if err != nil {
		return nil, err
	}
	rdb, err := cfg.Client()
	if err != nil {
		return nil, fmt.Errorf("redislock: %w", err)
	}
	opts.ID = pod.UID
	c, err := New(rdb, opts)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	c.pod = pod
	c.ownedRedis = rdb
	return c, nil
}

// Pod returns the pod the client was configured with by FromEnv; it is zero
// for a client from New.
func (c *Client) Pod() Pod { return c.pod }

func podFromEnv() (Pod, error) {
	pod := Pod{UID: os.Getenv(EnvPodUID), Name: os.Getenv(EnvPodName), Namespace: os.Getenv(EnvPodNamespace)}
	var missing []string
	for _, v := range []struct{ name, value string }{{EnvPodUID, pod.UID}, {EnvPodName, pod.Name}, {EnvPodNamespace, pod.Namespace}} {
		if v.value == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return Pod{}, fmt.Errorf("redislock: set %s from the downward API (fieldRef metadata.uid, metadata.name, metadata.namespace)", strings.Join(missing, ", "))
	}
	if !uidPattern.MatchString(pod.UID) {
		return Pod{}, fmt.Errorf("redislock: %s=%q is not a pod UID; set it from the downward API with fieldRef metadata.uid", EnvPodUID, pod.UID)
	}
	return pod, nil
}

func redisFromEnv() (redisconn.Config, error) {
	cfg := redisconn.Config{
		URL:            os.Getenv(EnvRedisURL),
		SentinelAddrs:  redisconn.SplitList(os.Getenv(EnvRedisSentinelAddrs)),
		SentinelMaster: os.Getenv(EnvRedisSentinelMaster),
		ClusterAddrs:   redisconn.SplitList(os.Getenv(EnvRedisClusterAddrs)),
		Username:       os.Getenv(EnvRedisUsername),
		Password:       os.Getenv(EnvRedisPassword),
		CAFile:         os.Getenv(EnvRedisCAFile),
	}
	switch tls := os.Getenv(EnvRedisTLS); tls {
	case "", "false":
	case "true":
		cfg.TLS = true
	default:
		return cfg, fmt.Errorf("redislock: %s=%q must be true or false", EnvRedisTLS, tls)
	}
	given := 0
	for _, set := range []bool{cfg.URL != "", len(cfg.SentinelAddrs) > 0, len(cfg.ClusterAddrs) > 0} {
		if set {
			given++
		}
	}
	if given != 1 {
		return cfg, fmt.Errorf("redislock: set exactly one of %s, %s (with %s) or %s", EnvRedisURL, EnvRedisSentinelAddrs, EnvRedisSentinelMaster, EnvRedisClusterAddrs)
	}
	if cfg.URL != "" && !strings.HasPrefix(cfg.URL, "redis://") && !strings.HasPrefix(cfg.URL, "rediss://") {
		return cfg, fmt.Errorf("redislock: %s must start with redis:// or rediss://", EnvRedisURL)
	}
	if len(cfg.SentinelAddrs) > 0 && cfg.SentinelMaster == "" {
		return cfg, fmt.Errorf("redislock: %s needs %s, the master's name", EnvRedisSentinelAddrs, EnvRedisSentinelMaster)
	}
	if file := os.Getenv(EnvRedisPasswordFile); file != "" {
		if cfg.Password != "" {
			return cfg, fmt.Errorf("redislock: set %s or %s, not both", EnvRedisPassword, EnvRedisPasswordFile)
		}
		secret, err := os.ReadFile(file)
		if err != nil {
			return cfg, fmt.Errorf("redislock: %s: %w", EnvRedisPasswordFile, errors.Unwrap(err))
		}
		cfg.Password = strings.TrimRight(string(secret), "\r\n")
	}
	return cfg, nil
}
