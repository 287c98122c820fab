// Package redisconn builds a go-redis client for standalone Redis, Sentinel
// or Redis Cluster from a URL or address lists, with credentials and TLS
// kept out of command lines and logs.
package redisconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Config says where Redis is and how to authenticate. Set exactly one of
// URL, SentinelAddrs (with SentinelMaster) or ClusterAddrs.
type Config struct {
	// URL is redis://host:port/db, or rediss:// for TLS.
	URL string
	// SentinelAddrs are host:port addresses of Sentinels watching SentinelMaster.
	SentinelAddrs  []string
	SentinelMaster string
	// ClusterAddrs are host:port addresses of some Redis Cluster nodes.
	ClusterAddrs []string

	// Username and Password authenticate (ACL user, or just a password).
	// They override any in URL.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves, when they require it (Sentinel's own requirepass or ACL
	// user), which may differ from the master's.
	SentinelUsername, SentinelPassword string
	// TLS turns on TLS for Sentinel and Cluster addresses; rediss:// turns it
	// on for URL.
	TLS bool
	// CAFile is a PEM file of CAs to trust for TLS, instead of the system's.
	CAFile string
}

// Client returns a go-redis client for the configuration.
func (c Config) Client() (redis.UniversalClient, error) {
	set := 0
	for _, given := range []bool{c.URL != "", len(c.SentinelAddrs) > 0, len(c.ClusterAddrs) > 0} {
		if given {
			set++
		}
	}
	if set != 1 {
		return nil, errors.New("redis: set exactly one of a URL (redis:// or rediss://), Sentinel addresses with a master name, or Cluster addresses")
	}
	tlsConfig, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	switch {
	case c.URL != "":
		opts, err := redis.ParseURL(c.URL)
		if err != nil {
			// The URL may hold a password: do not echo it.
			return nil, fmt.Errorf("redis: the URL is not a valid redis:// or rediss:// URL (%s)", redactedURLError(err))
		}
		if c.Username != "" {
			opts.Username = c.Username
		}
		if c.Password != "" {
			opts.Password = c.Password
		}
		if opts.TLSConfig != nil && tlsConfig != nil {
			tlsConfig.ServerName = opts.TLSConfig.ServerName
			opts.TLSConfig = tlsConfig
		}
		return redis.NewClient(opts), nil
	case len(c.SentinelAddrs) > 0:
		if c.SentinelMaster == "" {
			return nil, errors.New("redis: Sentinel addresses need the master's name")
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.SentinelMaster, SentinelAddrs: c.SentinelAddrs,
			SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword,
			Username: c.Username, Password: c.Password, TLSConfig: c.tlsIfWanted(tlsConfig),
		}), nil
	default:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.ClusterAddrs, Username: c.Username, Password: c.Password, TLSConfig: c.tlsIfWanted(tlsConfig),
		}), nil
	}
}

// Target describes where the client connects, without credentials, for logs.
func (c Config) Target() string {
	switch {
	case c.URL != "":
		if opts, err := redis.ParseURL(c.URL); err == nil {
			scheme := "redis"
			if opts.TLSConfig != nil {
				scheme = "rediss"
			}
			return fmt.Sprintf("%s://%s/%d", scheme, opts.Addr, opts.DB)
		}
		return "an invalid URL"
	case len(c.SentinelAddrs) > 0:
		return fmt.Sprintf("sentinel master %q via %s", c.SentinelMaster, strings.Join(c.SentinelAddrs, ","))
	default:
		return "cluster via " + strings.Join(c.ClusterAddrs, ",")
	}
}

func (c Config) tlsIfWanted(cfg *tls.Config) *tls.Config {
	if !c.TLS {
		return nil
	}
	if cfg == nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return cfg
}

func (c Config) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("redis: read the CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("redis: the CA file %s holds no PEM certificate", c.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// redactedURLError keeps go-redis's reason but not the URL it may quote.
func redactedURLError(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "://"); i >= 0 {
		return "invalid URL"
	}
	return msg
}

// ReadPasswordFile returns the password in file, a mounted Secret key,
// without the trailing newline an editor or `echo` leaves, which is never
// part of a password. The error names the file but not its content.
func ReadPasswordFile(file string) (string, error) {
	secret, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("redis: read the password file: %w", err)
	}
	return strings.TrimRight(string(secret), "\r\n"), nil
}

// SplitList splits a comma-separated list of addresses, dropping blanks.
func SplitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
