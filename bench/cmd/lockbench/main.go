// Command lockbench compares lockwarden's pkg/redislock with two other Go
// Redis lock libraries, github.com/go-redsync/redsync/v4 and
// github.com/bsm/redislock, in one run against one redis-server it starts
// itself on a free loopback port, and prints one markdown table.
//
//	cd bench && go run ./cmd/lockbench              # full run, about two minutes
//	cd bench && go run ./cmd/lockbench -short       # CI smoke run, ~40 s
//	cd bench && go run ./cmd/lockbench -only=scale  # just the watchdog scale table
//
// The comparison table's scenarios: the PING round trip (the floor); an
// uncontended Lock+Unlock pair; 8 clients contending for one lock (hold
// 200 µs, think 500 µs), beside its limit 1 / (hold + one pub/sub notice
// trip between two clients, measured in the same run); and 10,000 locks
// held by one client under lockwarden's watchdog. Most targets are relative
// to the best peer or to the limit of the same run. A second table,
// watchdog scale, shows one lockwarden client holding 1,000, 10,000 and
// 100,000 locks: renewal round trips, CPU, heap and goroutines per size,
// and the ratios between sizes. The machine may be noisy: compare the
// libraries with each other and with the RTT measured in the same run, and
// sizes with each other, not with absolute numbers from another run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	lw "github.com/lockwarden/lockwarden/pkg/redislock"
	"github.com/redis/go-redis/v9"
)

type config struct {
	short bool

	pings   int
	pairs   int
	notices int // pub/sub ping-pongs for the contended scenario's limit

	clients   int
	hold      time.Duration
	think     time.Duration
	contended time.Duration // per library, split over rounds
	mixed     time.Duration // the mixed fleet's measured time
	rounds    int
	warmup    time.Duration

	locks     int
	lease     time.Duration
	interval  time.Duration
	intervals int

	scale         sizes
	scaleLease    time.Duration
	scaleInterval time.Duration

	only        string // "" (both tables), "compare" or "scale"
	redisServer string
	strict      bool
}

// sizes is a flag holding a comma-separated list of lock counts.
type sizes []int

func (s *sizes) String() string {
	parts := make([]string, len(*s))
	for i, n := range *s {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (s *sizes) Set(v string) error {
	var out sizes
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		out = append(out, n)
	}
	*s = out
	return nil
}

func parseFlags() config {
	cfg := config{scale: sizes{1000, 10000, 100000}}
	flag.BoolVar(&cfg.short, "short", false, "short run for CI: fewer samples, 2s contended runs, 2,000 locks, scale sizes 1000,10000 (explicit flags still win)")
	flag.IntVar(&cfg.pings, "pings", 3000, "PING samples for the RTT floor")
	flag.IntVar(&cfg.pairs, "pairs", 3000, "uncontended Lock+Unlock pairs per library")
	flag.IntVar(&cfg.notices, "notices", 3000, "contended: pub/sub notice ping-pongs between two clients for the limit row, spread over the contended rounds")
	flag.IntVar(&cfg.clients, "clients", 8, "contending clients (each its own go-redis client and lock client)")
	flag.DurationVar(&cfg.hold, "hold", 200*time.Microsecond, "contended: how long each acquisition holds the lock")
	flag.DurationVar(&cfg.think, "think", 500*time.Microsecond, "contended: pause after each release")
	flag.DurationVar(&cfg.contended, "contended", 15*time.Second, "contended: measured time per library, split over -rounds")
	flag.IntVar(&cfg.rounds, "rounds", 3, "contended: rounds; each round runs every library once, in rotating order")
	flag.DurationVar(&cfg.mixed, "mixed", 10*time.Second, "mixed fleet (4 lockwarden and 4 Redisson-script clients on one lock, one CPU burner per core): measured time")
	flag.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "contended: unmeasured warm-up before each run's window")
	flag.IntVar(&cfg.locks, "locks", 10000, "locks held by one client in the watchdog scenario")
	flag.DurationVar(&cfg.lease, "lease", 3*time.Second, "watchdog scenario: lockwarden WatchdogLease")
	flag.DurationVar(&cfg.interval, "interval", time.Second, "watchdog scenario: lockwarden RenewInterval")
	flag.IntVar(&cfg.intervals, "intervals", 3, "watchdog and scale scenarios: renewal intervals observed")
	flag.Var(&cfg.scale, "scale", "scale scenario: comma-separated numbers of locks held by one lockwarden client, one table row each")
	flag.DurationVar(&cfg.scaleLease, "scale-lease", 6*time.Second, "scale scenario: lockwarden WatchdogLease")
	flag.DurationVar(&cfg.scaleInterval, "scale-interval", 2*time.Second, "scale scenario: lockwarden RenewInterval (long enough for a sweep of the largest size)")
	flag.StringVar(&cfg.only, "only", "", "run one table only: compare (the library comparison) or scale (watchdog scale); default both")
	flag.StringVar(&cfg.redisServer, "redis-server", "redis-server", "redis-server binary")
	flag.StringVar(&pauseMode, "pause", "nanosleep", "how hold/think pauses wait: nanosleep (nanosleep(2) + spin, accurate), go (time.Sleep, ~1 ms granularity) or spin (busy yield loop)")
	flag.BoolVar(&cfg.strict, "strict", false, "exit with status 1 if lockwarden misses a target (most are relative to the best peer or the limit measured in the same run) or fails a scale check")
	flag.Parse()

	if cfg.short {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("pings", func() { cfg.pings = 500 })
		def("pairs", func() { cfg.pairs = 500 })
		def("notices", func() { cfg.notices = 1500 })
		def("contended", func() { cfg.contended = 2 * time.Second })
		def("mixed", func() { cfg.mixed = 3 * time.Second })
		def("rounds", func() { cfg.rounds = 1 })
		def("warmup", func() { cfg.warmup = 300 * time.Millisecond })
		def("locks", func() { cfg.locks = 2000 })
		def("scale", func() { cfg.scale = sizes{1000, 10000} })
	}
	return cfg
}

func (cfg config) validate() error {
	switch {
	case cfg.pings < 1 || cfg.pairs < 1 || cfg.notices < 1:
		return errors.New("-pings, -pairs and -notices must be at least 1")
	case cfg.clients < 2:
		return errors.New("-clients must be at least 2")
	case cfg.rounds < 1 || cfg.contended <= 0 || cfg.mixed <= 0:
		return errors.New("-rounds must be at least 1, and -contended and -mixed above 0")
	case cfg.locks < 10:
		return errors.New("-locks must be at least 10")
	case !validLease(cfg.lease) || !validLease(cfg.scaleLease):
		return fmt.Errorf("-lease and -scale-lease must be whole numbers of milliseconds, at least %v", lw.MinLease)
	case cfg.interval <= 0 || cfg.interval >= cfg.lease:
		return errors.New("-interval must be above 0 and below -lease")
	case pauseMode != "nanosleep" && pauseMode != "go" && pauseMode != "spin":
		return errors.New("-pause must be nanosleep, go or spin")
	case cfg.intervals < 1:
		return errors.New("-intervals must be at least 1")
	case cfg.only != "" && cfg.only != "compare" && cfg.only != "scale":
		return errors.New("-only must be compare or scale")
	case cfg.scaleInterval <= 0 || cfg.scaleInterval >= cfg.scaleLease:
		return errors.New("-scale-interval must be above 0 and below -scale-lease")
	case len(cfg.scale) == 0 || slices.Min(cfg.scale) < 1:
		return errors.New("-scale needs one or more sizes of at least 1")
	}
	return nil
}

// validLease reports whether lockwarden accepts lease as a WatchdogLease.
func validLease(lease time.Duration) bool {
	return lease >= lw.MinLease && lease%time.Millisecond == 0
}

func main() {
	cfg := parseFlags()
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills at once (redis-server dies with us: PDEATHSIG)
	}()
	missed, err := run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(1)
	}
	if cfg.strict && missed > 0 {
		fmt.Fprintf(os.Stderr, "lockbench: lockwarden missed %d target(s)\n", missed)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) (int, error) {
	gStart := runtime.NumGoroutine()
	srv, err := startRedis(ctx, cfg.redisServer)
	if err != nil {
		return 0, err
	}
	defer srv.Stop()
	progress("redis-server %s on %s (GOMAXPROCS=%d, %d CPUs)", srv.Version, srv.Addr, runtime.GOMAXPROCS(0), runtime.NumCPU())

	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	missed := 0
	if cfg.only != "scale" {
		rep, err := runCompare(ctx, cfg, srv, admin)
		if err != nil {
			return 0, err
		}
		fmt.Print(rep.text)
		missed += rep.missed
	}
	if cfg.only != "compare" {
		var rows []*scaleRow
		for _, n := range cfg.scale {
			progress("watchdog scale: %s locks, lease %v, renew every %v, %d intervals observed", fmtInt(int64(n)), cfg.scaleLease, cfg.scaleInterval, cfg.intervals)
			r, err := runScale(ctx, cfg, srv.Addr, admin, n)
			if err != nil {
				return 0, fmt.Errorf("watchdog scale, %s locks: %w", fmtInt(int64(n)), err)
			}
			rows = append(rows, r)
		}
		rep := buildScaleReport(cfg, srv, rows)
		fmt.Print(rep.text)
		missed += rep.missed
	}

	_ = admin.Close()
	srv.Stop()
	if g := settledGoroutines(); g > gStart+1 { // +1: the signal watcher
		fmt.Fprintf(os.Stderr, "lockbench: warning: %d goroutines left running (started with %d)\n", g, gStart)
	}
	return missed, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lockbench: "+format+"\n", args...)
}

// runCompare runs the scenarios of the library comparison table.
func runCompare(ctx context.Context, cfg config, srv *redisServer, admin *redis.Client) (report, error) {
	probe, err := probeScriptCounting(ctx, admin)
	if err != nil {
		return report{}, fmt.Errorf("probe: %w", err)
	}

	progress("floor and uncontended: %d PINGs and %d pairs per library, interleaved", cfg.pings, cfg.pairs)
	unc, err := runUncontended(ctx, cfg, srv.Addr, admin)
	if err != nil {
		return report{}, fmt.Errorf("uncontended: %w", err)
	}

	cont := make(map[string]*contendedResult)
	for _, lib := range libraries {
		cont[lib.name] = &contendedResult{}
	}
	window := cfg.contended / time.Duration(cfg.rounds)
	// The notice ping-pongs for the limit row are taken in chunks, one
	// before each library's run, so they span the contended rounds and the
	// noise of the same minutes.
	notices := &noticeResult{}
	chunks := cfg.rounds * len(libraries)
	for r := range cfg.rounds {
		for i := range libraries {
			lib := libraries[(i+r)%len(libraries)]
			k := r*len(libraries) + i
			n := cfg.notices / chunks
			if k < cfg.notices%chunks {
				n++
			}
			if err := runNotices(ctx, srv.Addr, n, notices); err != nil {
				return report{}, fmt.Errorf("pub/sub notice trip: %w", err)
			}
			progress("contended round %d/%d: %s, %d clients, %v (after %d notice ping-pongs)", r+1, cfg.rounds, lib.name, cfg.clients, window, n)
			if err := runContended(ctx, cfg, srv.Addr, admin, lib, window, cont[lib.name]); err != nil {
				return report{}, fmt.Errorf("contended %s: %w", lib.name, err)
			}
		}
	}

	progress("mixed fleet: 4 lockwarden and 4 Redisson-script clients on one lock, %d CPU burners, %v", runtime.NumCPU(), cfg.mixed)
	mixed, err := runMixed(ctx, cfg, srv.Addr)
	if err != nil {
		return report{}, fmt.Errorf("mixed fleet: %w", err)
	}

	progress("%d locks: lockwarden watchdog (lease %v, renew every %v, %d intervals observed); peers' Extend/Refresh pass", cfg.locks, cfg.lease, cfg.interval, cfg.intervals)
	many, err := runMany(ctx, cfg, srv.Addr, admin)
	if err != nil {
		return report{}, fmt.Errorf("many locks: %w", err)
	}
	return buildReport(cfg, srv, probe, unc, cont, notices, many, mixed), nil
}
