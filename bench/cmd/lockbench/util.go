package main

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// pauseMode selects how pause waits: "nanosleep" (default), "go" (time.Sleep) or "spin".
var pauseMode = "nanosleep"

// pause waits d accurately. Go's time.Sleep rounds sub-millisecond sleeps up
// to about 1 ms on Linux when the runtime is idle (its poller waits in whole
// milliseconds), which would turn "hold 200 µs" into "hold ~1.1 ms". So pause
// blocks the thread in nanosleep(2) until shortly before the deadline and
// yields in a loop for the rest. All libraries are driven with it.
func pause(d time.Duration) {
	switch pauseMode {
	case "go":
		time.Sleep(d)
		return
	case "spin":
		for deadline := time.Now().Add(d); time.Now().Before(deadline); {
			runtime.Gosched()
		}
		return
	}
	const slack = 80 * time.Microsecond // nanosleep overshoots by ~50 µs timer slack
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline) - slack
		if left <= 0 {
			break
		}
		ts := syscall.NsecToTimespec(int64(left))
		if err := syscall.Nanosleep(&ts, nil); err != nil && !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	for time.Now().Before(deadline) {
		runtime.Gosched()
	}
}

// durations is a sample of latencies.
type durations []time.Duration

func (d durations) sorted() durations {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// pct returns the p-th percentile (0 < p <= 100) of a sorted sample, nearest rank.
func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	i = max(0, min(i, len(d)-1))
	return d[i]
}

func (d durations) max() time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1]
}

// fmtDur prints µs below 1 ms, ms below 1 s, and s above.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

// fmtInt prints an integer with thousands separators.
func fmtInt(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtFloat(f float64) string {
	switch {
	case f >= 1000:
		return fmtInt(int64(math.Round(f)))
	case f >= 100:
		return fmt.Sprintf("%.0f", f)
	default:
		return fmt.Sprintf("%.2f", f)
	}
}

// ratio formats a/b as "4.1×".
func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a/b) || math.IsInf(a/b, 0) {
		return "n/a"
	}
	r := a / b
	if r >= 10 {
		return fmt.Sprintf("%.0f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// newRedisClient returns a go-redis client on addr with the hook, if any.
func newRedisClient(addr string, hook *counter) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if hook != nil {
		rdb.AddHook(hook)
	}
	return rdb
}

// fmtBytes prints bytes in B, KiB or MiB.
func fmtBytes(n int64) string {
	f := float64(n)
	switch {
	case math.Abs(f) >= 1<<20:
		return fmt.Sprintf("%.1f MiB", f/(1<<20))
	case math.Abs(f) >= 1<<10:
		return fmt.Sprintf("%.1f KiB", f/(1<<10))
	default:
		return fmt.Sprintf("%d B", n)
	}
}
