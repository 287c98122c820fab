package main

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"k8s.io/klog/v2"
)

// routeLogs sends every library's log lines through logger, the manager's
// structured (JSON) logger, so the pod log holds nothing else: klog's
// (client-go: leader election, reflectors, the event broadcaster), go-redis's
// (pool and Sentinel messages, printed to stderr as plain text by default),
// and the standard library's log package (net/http's TLS handshake errors on
// the metrics server, among others).
func routeLogs(logger logr.Logger) {
	klog.SetLogger(logger.WithName("klog"))
	redis.SetLogger(redisLogger{logger.WithName("go-redis")})
	log.SetFlags(0)
	log.SetPrefix("")
	log.SetOutput(stdlibLogWriter{logger.WithName("stdlib")})
}

// redisLogger is go-redis's Logging interface over logr. go-redis logs
// only what went wrong or changed (a dial that failed, a Sentinel that
// switched masters), never a command or its arguments. Its connection pool
// says so on every failed dial, several times a second while Redis is down:
// those lines are debug (--zap-log-level=debug), since the manager's own
// "Redis does not answer" error says it once per outage.
type redisLogger struct{ logger logr.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if strings.HasPrefix(msg, "connection pool:") {
		l.logger.V(1).Info(msg)
		return
	}
	l.logger.Info(msg)
}

// stdlibLogWriter receives the standard log package's lines, one per Write.
type stdlibLogWriter struct{ logger logr.Logger }

func (w stdlibLogWriter) Write(p []byte) (int, error) {
	w.logger.Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
