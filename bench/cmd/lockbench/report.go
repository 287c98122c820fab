package main

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"time"
)

// Targets from the issue. The comparison's targets are relative to the
// best peer in the same run: for the contended scenario the peer with the
// higher throughput, for the uncontended pair the peer with the lower median
// pair latency.
const (
	targetPairVsPeer  = 1.10                  // uncontended pair ≤ 1.10 × the fastest peer's
	targetPairCmds    = 9                     // Redis commands per uncontended pair, script-internal included
	targetPerScript   = 10 * time.Microsecond // Redis execution time per script call
	targetPairAllocs  = 30                    // Go heap allocations per uncontended pair
	targetAcqCmds     = 20                    // Redis commands per contended acquisition, script-internal included
	targetMixedShare  = 0.40                  // Redisson side's share in the mixed fleet
	targetVsBestPeer  = 2.5                   // contended throughput ≥ 2.5 × the best peer's
	targetOfLimit     = 0.90                  // contended throughput ≥ 90% of the limit row
	targetP99Frac     = 0.1                   // contended wait p99 ≤ 1/10 of the best peer's
	targetMax         = 20 * time.Millisecond // longest contended wait
	targetRenewBatch  = 100                   // lockwarden's RenewBatchSize default
	renewSlackPercent = 10                    // "about" N/100 round trips: within 10%
)

type report struct {
	text   string
	missed int
}

type row struct {
	scenario, metric string
	vals             [3]string // lockwarden, redsync, bsm/redislock
	target, verdict  string
}

func buildReport(cfg config, srv *redisServer, probe probeResult, unc *uncontendedResult, cont map[string]*contendedResult, notices *noticeResult, many *manyResult, mixed *mixedResult) report {
	var (
		rows   []row
		missed int
		notes  []string
	)
	names := [3]string{"lockwarden", "redsync", "bsm/redislock"}
	peers := names[1:]
	verdict := func(ok bool, miss string) string {
		if ok {
			return "yes"
		}
		missed++
		return "**NO** — " + miss
	}
	per := func(f func(name string) string) [3]string {
		var v [3]string
		for i, n := range names {
			v[i] = f(n)
		}
		return v
	}

	// Floor.
	rtt := unc.rtt.pct(50)
	rttS := fmtDur(rtt)
	rows = append(rows, row{"floor", "PING RTT, median (go-redis)", [3]string{rttS, rttS, rttS}, "—", "—"})

	// Uncontended. The best peer here is the one with the lower median pair.
	pair := func(n string) time.Duration { return unc.pairs[n].pct(50) }
	pairPeer := peers[0]
	for _, n := range peers[1:] {
		if pair(n) < pair(pairPeer) {
			pairPeer = n
		}
	}
	ourPair, peerPair := pair("lockwarden"), pair(pairPeer)
	perScript := func(n string) string {
		if unc.scriptCall[n] == 0 {
			return "no scripts"
		}
		return fmt.Sprintf("%s (%.0f calls)", fmtDur(unc.perScript[n]), unc.scriptCall[n])
	}
	rows = append(rows,
		row{"uncontended Lock+Unlock", "pair latency, median", per(func(n string) string { return fmtDur(pair(n)) }),
			fmt.Sprintf("≤ %.2f × fastest peer's (%s: %s) = %s", targetPairVsPeer, pairPeer, fmtDur(peerPair), fmtDur(time.Duration(targetPairVsPeer*float64(peerPair)))),
			verdict(float64(ourPair) <= targetPairVsPeer*float64(peerPair), fmt.Sprintf("%s, %s %s's", fmtDur(ourPair), ratio(float64(ourPair), float64(peerPair)), pairPeer))},
		row{"uncontended Lock+Unlock", "Redis commands per pair, script-internal included (INFO commandstats)",
			per(func(n string) string { return fmt.Sprintf("%.2f", unc.redisCmds[n]) }),
			fmt.Sprintf("≤ %d", targetPairCmds), verdict(unc.redisCmds["lockwarden"] <= targetPairCmds, fmt.Sprintf("%.2f", unc.redisCmds["lockwarden"]))},
		row{"uncontended Lock+Unlock", "Redis execution time per script call (commandstats usec / calls)", per(perScript),
			fmt.Sprintf("≤ %s", fmtDur(targetPerScript)), verdict(unc.perScript["lockwarden"] <= targetPerScript, fmtDur(unc.perScript["lockwarden"]))},
		row{"uncontended Lock+Unlock", "Go heap allocations per pair (testing.AllocsPerRun)",
			per(func(n string) string { return fmt.Sprintf("%.0f", unc.allocs[n]) }),
			fmt.Sprintf("≤ %d", targetPairAllocs), verdict(unc.allocs["lockwarden"] <= targetPairAllocs, fmt.Sprintf("%.0f", unc.allocs["lockwarden"]))},
		row{"uncontended Lock+Unlock", "pair / RTT", per(func(n string) string { return fmt.Sprintf("%.2f", float64(pair(n))/float64(rtt)) }), "—", "—"},
		row{"uncontended Lock+Unlock", "the same round trips with empty scripts (the design's floor) / RTT", per(func(n string) string {
			return fmt.Sprintf("%.2f", float64(unc.shapes[n].pct(50))/float64(rtt))
		}), "—", "—"},
		row{"uncontended Lock+Unlock", "of which Redis executing (commandstats usec) / the rest beyond 2 RTT", per(func(n string) string {
			rest := pair(n) - 2*rtt - unc.server[n]
			return fmt.Sprintf("%s / %s", fmtDur(unc.server[n]), fmtDur(rest))
		}), "—", "—"},
		row{"uncontended Lock+Unlock", "bench-process CPU per pair (user+sys, incl. go-redis and syscalls)", per(func(n string) string { return fmtDur(unc.cpu[n]) }), "—", "—"},
		row{"uncontended Lock+Unlock", "pair p99", per(func(n string) string { return fmtDur(unc.pairs[n].pct(99)) }), "—", "—"},
		row{"uncontended Lock+Unlock", "commands sent per pair", per(func(n string) string {
			return fmt.Sprintf("%.2f", float64(unc.sent[n].total)/float64(unc.numPairs[n]))
		}), "—", "—"},
	)

	// Contended.
	sc := fmt.Sprintf("%d contending clients", cfg.clients)
	c := func(n string) *contendedResult { return cont[n] }
	ours := c("lockwarden")
	oursWaits := ours.waits.sorted()
	waits := func(n string) durations { return c(n).waits.sorted() }
	tp := func(n string) float64 { return c(n).throughput() }
	// The best peer here is the one with the higher throughput.
	best := peers[0]
	for _, n := range peers[1:] {
		if tp(n) > tp(best) {
			best = n
		}
	}
	// The limit: holders that change hands through one pub/sub notice, and
	// nothing else, reach at most 1 / (hold + one notice trip).
	hold := holdMedianDur(cont)
	trip := notices.trip()
	limit := 0.0
	if hold+trip > 0 {
		limit = float64(time.Second) / float64(hold+trip)
	}
	ofLimit := func(n string) float64 {
		if limit == 0 {
			return 0
		}
		return tp(n) / limit
	}
	pct := func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) }
	same := func(v string) [3]string { return [3]string{v, v, v} }
	bestP99 := waits(best).pct(99)
	p99Cap := time.Duration(targetP99Frac * float64(bestP99))
	srvCmds := func(n string) float64 { return c(n).serverCmdsPerAcq() }
	srvCmdsNote := ""
	if probe.cmdstatInner < 1 {
		srvCmdsNote = " (this Redis did NOT count a script's calls in the probe)"
	}
	rows = append(rows,
		row{sc, "acquisitions/s", per(func(n string) string { return fmtInt(int64(math.Round(tp(n)))) }),
			fmt.Sprintf("≥ %.1f × best peer (%s: %s/s) = %s/s", targetVsBestPeer, best, fmtInt(int64(math.Round(tp(best)))), fmtInt(int64(math.Round(targetVsBestPeer*tp(best))))),
			verdict(ours.acquisitions > 0 && tp("lockwarden") >= targetVsBestPeer*tp(best),
				fmt.Sprintf("%s %s's", ratio(tp("lockwarden"), tp(best)), best))},
		row{sc, "pub/sub notice trip, one way (a client's PUBLISH sent → the other client has the message), median ping-pong / 2",
			same(fmt.Sprintf("%s = %.2f RTT", fmtDur(trip), float64(trip)/float64(rtt))), "—", "—"},
		row{sc, "limit: 1 / (hold + one pub/sub notice trip)",
			same(fmt.Sprintf("%s/s = 1 / (%s + %s)", fmtInt(int64(math.Round(limit))), fmtDur(hold), fmtDur(trip))), "—", "—"},
		row{sc, "throughput / limit", per(func(n string) string { return pct(ofLimit(n)) }),
			fmt.Sprintf("≥ %.0f%% of the limit = %s/s", targetOfLimit*100, fmtInt(int64(math.Round(targetOfLimit*limit)))),
			verdict(limit > 0 && ofLimit("lockwarden") >= targetOfLimit,
				fmt.Sprintf("%s of the limit, %s/s short", pct(ofLimit("lockwarden")), fmtInt(int64(math.Round(targetOfLimit*limit-tp("lockwarden"))))))},
		row{sc, "wait p50", per(func(n string) string { return fmtDur(waits(n).pct(50)) }), "—", "—"},
		row{sc, "wait p99", per(func(n string) string { return fmtDur(waits(n).pct(99)) }),
			fmt.Sprintf("≤ 1/10 of best peer's (%s: %s) = %s", best, fmtDur(bestP99), fmtDur(p99Cap)),
			verdict(len(oursWaits) > 0 && len(waits(best)) > 0 && oursWaits.pct(99) <= p99Cap,
				fmt.Sprintf("%s = %s %s's", fmtDur(oursWaits.pct(99)), ratio(float64(oursWaits.pct(99)), float64(bestP99)), best))},
		row{sc, "wait max", per(func(n string) string { return fmtDur(waits(n).max()) }),
			"≤ 20 ms", verdict(len(oursWaits) > 0 && oursWaits.max() <= targetMax, fmtDur(oursWaits.max()))},
		row{sc, "waits over 20 ms", per(func(n string) string {
			w := waits(n)
			over := 0
			for i := len(w) - 1; i >= 0 && w[i] > targetMax; i-- {
				over++
			}
			return fmt.Sprintf("%d of %s", over, fmtInt(int64(len(w))))
		}), "0", "—"},
		row{sc, "commands sent per acquisition", per(func(n string) string { return fmt.Sprintf("%.2f", c(n).cmdsPerAcq()) }), "—", "—"},
		row{sc, "Redis commands per acquisition, inside scripts included (INFO commandstats)" + srvCmdsNote,
			per(func(n string) string { return fmt.Sprintf("%.2f", srvCmds(n)) }),
			fmt.Sprintf("≤ %d", targetAcqCmds),
			verdict(ours.acquisitions > 0 && srvCmds("lockwarden") <= targetAcqCmds,
				fmt.Sprintf("%.2f, %s %s's", srvCmds("lockwarden"), ratio(srvCmds("lockwarden"), srvCmds(best)), best))},
		row{sc, "handoff gap per acquisition (1/throughput − hold), in idle PING RTTs", per(func(n string) string {
			r := c(n)
			if r.acquisitions == 0 {
				return "n/a"
			}
			gap := time.Duration(float64(time.Second)/r.throughput()) - r.holds.sorted().pct(50)
			return fmt.Sprintf("%s = %.1f RTT", fmtDur(gap), float64(gap)/float64(rtt))
		}), "—", "—"},
		row{sc, "CPU per acquisition: redis-server / bench process (cores busy)", per(func(n string) string {
			r := c(n)
			if r.acquisitions == 0 {
				return "n/a"
			}
			a := float64(r.acquisitions)
			return fmt.Sprintf("%s / %s (%.2f / %.2f)", fmtDur(time.Duration(float64(r.redisCPU)/a)), fmtDur(time.Duration(float64(r.selfCPU)/a)),
				r.redisCPU.Seconds()/r.window.Seconds(), r.selfCPU.Seconds()/r.window.Seconds())
		}), "—", "—"},
		row{sc, "acquisitions measured", per(func(n string) string { return fmtInt(c(n).acquisitions) }), "—", "—"},
		row{sc, "gave-up acquire calls (retried) / exclusion violations / errors", per(func(n string) string {
			r := c(n)
			return fmt.Sprintf("%d / %d / %d", r.failed, r.violations, r.errors)
		}), "0 violations, 0 errors", verdict(ours.violations == 0 && ours.errors == 0,
			fmt.Sprintf("%d violations, %d errors", ours.violations, ours.errors))},
	)

	// Mixed fleet.
	if mixed != nil {
		ms := fmt.Sprintf("mixed fleet: %d lockwarden + %d Redisson-script clients, %d CPU burners", mixed.perSide, mixed.perSide, mixed.burners)
		total := mixed.ours + mixed.theirs
		share := 0.0
		if total > 0 {
			share = float64(mixed.theirs) / float64(total)
		}
		rows = append(rows,
			row{ms, "acquisitions: lockwarden / Redisson side", [3]string{fmt.Sprintf("%s / %s", fmtInt(mixed.ours), fmtInt(mixed.theirs)), "—", "—"}, "—", "—"},
			row{ms, "Redisson side's share", [3]string{pct(share), "—", "—"},
				fmt.Sprintf("≥ %.0f%%", targetMixedShare*100), verdict(total > 0 && share >= targetMixedShare && mixed.overlaps == 0,
					fmt.Sprintf("%s, %d overlaps", pct(share), mixed.overlaps))},
			row{ms, "exclusion violations / errors", [3]string{fmt.Sprintf("%d / %d", mixed.overlaps, mixed.errors), "—", "—"}, "0", "—"},
		)
	}

	// Many locks.
	ms := fmt.Sprintf("%s locks, one client", fmtInt(int64(many.n)))
	k := float64(many.intervals)
	rtPer := float64(many.roundTrips) / k
	renPer := float64(many.renewals) / k
	wantRT := math.Ceil(float64(many.n) / targetRenewBatch)
	rtOK := rtPer >= wantRT*(1-renewSlackPercent/100.0) && rtPer <= wantRT*(1+renewSlackPercent/100.0)
	peerVal := func(n string, f func(p peerMany) string) string {
		p, ok := many.peers[n]
		if !ok {
			return "n/a"
		}
		return f(p)
	}
	peerRT := map[string]string{"redsync": "Mutex.ExtendContext", "bsm/redislock": "Lock.Refresh"}
	var sweepTook durations
	var pipesPerSweep []string
	for _, s := range many.sweeps {
		sweepTook = append(sweepTook, s.took)
		pipesPerSweep = append(pipesPerSweep, fmt.Sprint(s.pipelines))
	}
	sweepTook = sweepTook.sorted()
	gDelta := many.gHoldAll - many.gHoldSome
	rows = append(rows,
		row{ms, "round trips per renewal interval", [3]string{
			fmtFloat(rtPer),
			peerVal("redsync", func(p peerMany) string { return fmtInt(p.roundTrips) + " (caller calls Extend per lock; no watchdog)" }),
			peerVal("bsm/redislock", func(p peerMany) string { return fmtInt(p.roundTrips) + " (caller calls Refresh per lock; no watchdog)" }),
		}, fmt.Sprintf("≈ %s", fmtInt(int64(wantRT))),
			verdict(rtOK, fmt.Sprintf("%s round trips per interval", fmtFloat(rtPer)))},
		row{ms, "renewals per interval", [3]string{
			fmt.Sprintf("%s (server: %s EVALSHA)", fmtFloat(renPer), fmtFloat(float64(many.serverEvals)/k)),
			peerVal("redsync", func(p peerMany) string { return fmtInt(p.cmds) + " if the caller does it" }),
			peerVal("bsm/redislock", func(p peerMany) string { return fmtInt(p.cmds) + " if the caller does it" }),
		}, fmtInt(int64(many.n)), verdict(math.Abs(renPer-float64(many.n)) <= float64(many.n)*renewSlackPercent/100 && many.leasesLost == 0 && many.stillHeld == many.n,
			fmt.Sprintf("%s renewals/interval, %d leases lost, %d of %d still held", fmtFloat(renPer), many.leasesLost, many.stillHeld, many.n))},
		row{ms, "time to renew all once", [3]string{
			fmt.Sprintf("%s median sweep (%s pipelines per sweep)", fmtDur(sweepTook.pct(50)), strings.Join(pipesPerSweep, "/")),
			peerVal("redsync", func(p peerMany) string {
				return fmtDur(p.took) + " (sequential " + peerRT["redsync"] + failedNote(p) + ")"
			}),
			peerVal("bsm/redislock", func(p peerMany) string {
				return fmtDur(p.took) + " (sequential " + peerRT["bsm/redislock"] + failedNote(p) + ")"
			}),
		}, "—", "—"},
		row{ms, "renewal goroutines", [3]string{
			fmt.Sprintf("%d (goroutines holding %s vs %s locks: %+d)", many.renewLoops, fmtInt(int64(many.n/10)), fmtInt(int64(many.n)), gDelta),
			"none provided: the caller's own", "none provided: the caller's own",
		}, "1, not growing with locks", verdict(many.renewLoops == 1 && gDelta <= 0,
			fmt.Sprintf("%d renewal loops, %+d goroutines from %s to %s locks", many.renewLoops, gDelta, fmtInt(int64(many.n/10)), fmtInt(int64(many.n))))},
	)

	// Render.
	var b strings.Builder
	fmt.Fprintf(&b, "\n## lockbench: lockwarden vs redsync vs bsm/redislock\n\n")
	fmt.Fprintf(&b, "Redis %s on loopback, one server for everything; %s, GOMAXPROCS=%d; %s.\n\n",
		srv.Version, runtime.Version(), runtime.GOMAXPROCS(0), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	b.WriteString("| scenario | metric | lockwarden | redsync | bsm/redislock | target | ours meets target? |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", r.scenario, r.metric, r.vals[0], r.vals[1], r.vals[2], r.target, r.verdict)
	}

	// Ratios.
	b.WriteString("\nRatios (same run, same server):\n\n")
	p := func(n string) float64 { return float64(pair(n)) }
	fmt.Fprintf(&b, "- uncontended pair latency: lockwarden %s RTT; redsync %s; bsm %s (lockwarden/redsync %s, lockwarden/bsm %s; lower is better; target lockwarden / best peer (%s) ≤ 1×)\n",
		ratio(p("lockwarden"), float64(rtt)), ratio(p("redsync"), float64(rtt)), ratio(p("bsm/redislock"), float64(rtt)),
		ratio(p("lockwarden"), p("redsync")), ratio(p("lockwarden"), p("bsm/redislock")), pairPeer)
	fmt.Fprintf(&b, "- contended throughput: lockwarden %s redsync, %s bsm; lockwarden / best peer (%s) %s (target ≥ %.1f×)\n",
		ratio(tp("lockwarden"), tp("redsync")), ratio(tp("lockwarden"), tp("bsm/redislock")), best, ratio(tp("lockwarden"), tp(best)), targetVsBestPeer)
	fmt.Fprintf(&b, "- contended throughput / limit (%s/s = 1 / (hold %s + one notice trip %s)): lockwarden %s, redsync %s, bsm %s (target for lockwarden ≥ %.0f%%)\n",
		fmtInt(int64(math.Round(limit))), fmtDur(hold), fmtDur(trip), pct(ofLimit("lockwarden")), pct(ofLimit("redsync")), pct(ofLimit("bsm/redislock")), targetOfLimit*100)
	w99 := func(n string) float64 { return float64(waits(n).pct(99)) }
	wmax := func(n string) float64 { return float64(waits(n).max()) }
	fmt.Fprintf(&b, "- contended p99 wait: redsync %s lockwarden's, bsm %s lockwarden's; lockwarden / best peer (%s) %s (target ≤ %.2f×); max wait: redsync %s, bsm %s lockwarden's\n",
		ratio(w99("redsync"), w99("lockwarden")), ratio(w99("bsm/redislock"), w99("lockwarden")),
		best, ratio(w99("lockwarden"), w99(best)), targetP99Frac,
		ratio(wmax("redsync"), wmax("lockwarden")), ratio(wmax("bsm/redislock"), wmax("lockwarden")))
	cp := func(n string) float64 { return c(n).cmdsPerAcq() }
	fmt.Fprintf(&b, "- contended commands sent per acquisition: redsync %s lockwarden's, bsm %s lockwarden's\n",
		ratio(cp("redsync"), cp("lockwarden")), ratio(cp("bsm/redislock"), cp("lockwarden")))
	fmt.Fprintf(&b, "- contended Redis commands per acquisition, inside scripts included: lockwarden %.2f, redsync %.2f, bsm %.2f; lockwarden / best peer (%s) %s (target ≤ 1×)\n",
		srvCmds("lockwarden"), srvCmds("redsync"), srvCmds("bsm/redislock"), best, ratio(srvCmds("lockwarden"), srvCmds(best)))
	if pr, ok := many.peers["redsync"]; ok && rtPer > 0 {
		fmt.Fprintf(&b, "- renewing %s locks: lockwarden %s round trips per interval vs %s per pass for redsync/bsm callers (%s fewer); one pass: lockwarden %s vs redsync %s, bsm %s\n",
			fmtInt(int64(many.n)), fmtFloat(rtPer), fmtInt(pr.roundTrips), ratio(float64(pr.roundTrips), rtPer),
			fmtDur(sweepTook.pct(50)), fmtDur(pr.took), fmtDur(many.peers["bsm/redislock"].took))
	}

	// Footnotes.
	b.WriteString("\nHow this was measured:\n\n")
	fmt.Fprintf(&b, "- Floor and uncontended: %s PINGs and %s Lock+Unlock pairs per library on one lock name, each series on its own go-redis client, interleaved one sample at a time in rotating order so noise hits all alike. lockwarden: Mutex.Lock and Hold.Unlock with the default watchdog lease; redsync: LockContext/UnlockContext, expiry 10s; bsm: Obtain/Release, TTL 10s. Commands and Redis execution time per pair come from a separate batch of %s pairs per library, one library at a time (execution time = INFO commandstats usec of the commands the client sent; a script's time includes the calls it makes). The design's floor: each library's Lock+Unlock commands with the same keys and arguments but every script replaced by an empty one (lockwarden: take.lua's EVALSHA with 4 keys and 3 arguments, then unlock.lua's with 2 and 2; the peers: SET PX and one EVALSHA), interleaved with the pairs on its own go-redis client. Redis commands per pair = every call in the batch's INFO commandstats delta, script-internal ones included, less the harness's INFO; execution time per script call = the EVALSHA and EVAL usec over their calls in that delta. Allocations per pair = testing.AllocsPerRun over another %s pairs (the process's heap allocations, GOMAXPROCS 1 while it runs).\n",
		fmtInt(int64(cfg.pings)), fmtInt(int64(cfg.pairs)), fmtInt(int64(unc.numPairs["lockwarden"])), fmtInt(int64(unc.numPairs["lockwarden"])))
	if mixed != nil {
		fmt.Fprintf(&b, "- Mixed fleet: %d lockwarden clients (Mutex.Lock, default Options) and %d clients running Redisson's own RLock scripts (tryLockInnerAsync, unlockInnerAsync; they wait subscribed to the lock's channel and try on each message or when the holder's lease would end), each on its own go-redis client, on one lock: hold %v, think %v, for %v after a %v warm-up, while %d goroutines spin on the CPUs. Acquisitions are counted per side inside the window; an overlap is an acquisition that found another side's holder inside.\n",
			mixed.perSide, mixed.perSide, cfg.hold, cfg.think, mixed.window, cfg.warmup, mixed.burners)
		if mixed.firstErr != "" {
			notes = append(notes, fmt.Sprintf("- mixed fleet errors: %d, first: %s\n", mixed.errors, mixed.firstErr))
		}
	}
	fmt.Fprintf(&b, "- Contended: %d goroutines, each with its own go-redis client and lock client, on one lock name: acquire (blocking), hold %v, release, think %v. %v measured per library in %d round(s) with rotating order, each after a %v unmeasured warm-up (dial, script load, SUBSCRIBE). Wait = start of the acquire call to its return (for the peers, across the caller's retries when the library gives up). Holds/thinks use nanosleep + spin (Go's time.Sleep rounds sub-ms sleeps up to ~1 ms); measured hold median: %s.\n",
		cfg.clients, cfg.hold, cfg.think, cfg.contended, cfg.rounds, cfg.warmup, holdMedian(cont))
	fmt.Fprintf(&b, "  - lockwarden: %s.\n  - redsync: %s.\n  - bsm: %s.\n", oursDesc, redsyncDesc, bsmRetryDesc)
	fmt.Fprintf(&b, "  - Targets are relative to the best peer of the same run: the peer with the higher contended throughput (here %s) for throughput, p99 wait and Redis commands per acquisition; the peer with the lower median pair (here %s) for the uncontended pair.\n",
		best, pairPeer)
	fmt.Fprintf(&b, "- Limit: the highest throughput a lock could reach whose holders change hands through one pub/sub notice and nothing else, with this hold: 1 / (measured hold median %s + one notice trip %s) = %s/s. One notice trip = from the moment a client sends PUBLISH (its write of the command) until another client, subscribed to that channel on its own pub/sub connection, has read the message off that connection: the command's way to Redis, its execution, and the message's way out. %s Measured as %s ping-pongs (after %d unmeasured per chunk) between two go-redis clients A and B, each its own client as each contending worker is, with its own pub/sub connection: A PUBLISHes to B's channel, B (reading its pub/sub connection in a loop, no Go channel in between) PUBLISHes back to A's channel as soon as it has the message, and the sample ends when A has read it; one ping-pong = two notice trips, so one trip = median ping-pong / 2 (ping-pong p50 %s, p90 %s, p99 %s). The samples are taken on the same redis-server in %d chunks, one before each library's contended run in every round (so in the same rotating order and the same minutes), each on a new pair of clients closed before the run's warm-up, so no pub/sub traffic of theirs falls in a measurement window.\n",
		fmtDur(hold), fmtDur(trip), fmtInt(int64(math.Round(limit))), thinkNote(cfg, hold+trip),
		fmtInt(int64(len(notices.pingPongs))), noticeWarm,
		fmtDur(notices.pingPongs.sorted().pct(50)), fmtDur(notices.pingPongs.sorted().pct(90)), fmtDur(notices.pingPongs.sorted().pct(99)),
		cfg.rounds*len(libraries))
	fmt.Fprintf(&b, "  - Longest wait during warm-ups (not in the table): lockwarden %s, redsync %s, bsm %s.\n",
		fmtDur(c("lockwarden").warmupMax), fmtDur(c("redsync").warmupMax), fmtDur(c("bsm/redislock").warmupMax))
	fmt.Fprintf(&b, "- Commands sent = commands the clients sent to Redis. A probe on this server showed that Redis %s counts commands called inside scripts (one EVAL calling SET raised cmdstat_set by %d and total_commands_processed by %d), so neither counter alone gives client-sent commands. The same method is used for all libraries: a go-redis hook on every client counts each command passed to Process and each command in a pipeline, plus the server-side INFO commandstats delta of SUBSCRIBE/UNSUBSCRIBE/PSUBSCRIBE/PUNSUBSCRIBE/PING, which go-redis sends on PubSub connections without running hooks (the harness sends none of those during a window). Hook-counted EVALSHA+EVAL is checked against the server's cmdstat_evalsha+eval: %s.\n",
		srv.Version, probe.cmdstatInner, probe.totalDelta, evalCheck(unc, cont))
	fmt.Fprintf(&b, "- Redis commands per acquisition, inside scripts included = the INFO commandstats calls delta over the contended windows, every command summed (each EVALSHA and each command its script calls, PUBLISH included, plus the pub/sub commands), less the harness's own INFO calls that open and close each window, ÷ acquisitions in the windows. The probe above shows whether this Redis counts a script's calls there (cmdstat_set +%d for one SET in a script).\n",
		probe.cmdstatInner)
	b.WriteString("- Command mix per acquisition (contended): ")
	var mixes []string
	for _, n := range names {
		r := c(n)
		if r.acquisitions > 0 {
			mixes = append(mixes, fmt.Sprintf("%s: %s", n, r.sent().mix(float64(r.acquisitions))))
		}
	}
	b.WriteString(strings.Join(mixes, "; ") + ".\n")
	fmt.Fprintf(&b, "- %s locks: lockwarden client with WatchdogLease %v, RenewInterval %v, RenewBatchSize 100; locks taken with TryLock(ctx, 0) by 8 goroutines (%s); then %d renewal ticks observed: round trips = hook-counted Process calls + pipeline executions (a pipeline is one round trip), renewals = EVALSHAs sent (server cmdstat_evalsha agrees or is shown). Renewal goroutines = goroutines whose stack runs (*Client).renewLoop; goroutine counts are taken with the lock-taking goroutines gone. Leases lost: %d; lock keys still present after the window: %s of %s (window %v ≥ lease %v, so a key exists only if renewed). Goroutines: before New %d, after New %d, holding %s: %d, holding %s: %d, after Close %d. Peers have no watchdog: the column shows one sequential pass of Extend/Refresh over the same number of locks, which their callers must repeat every interval (batching would need pipelining outside the libraries' APIs).\n",
		fmtInt(int64(many.n)), many.lease, many.every, fmtDur(many.acquireTook), many.intervals, many.leasesLost, fmtInt(int64(many.stillHeld)), fmtInt(int64(many.n)),
		time.Duration(many.intervals)*many.every, many.lease,
		many.gBefore, many.gAfterNew, fmtInt(int64(many.n/10)), many.gHoldSome, fmtInt(int64(many.n)), many.gHoldAll, many.gAfterClose)
	for _, n := range names {
		if r := c(n); r.firstErr != "" {
			notes = append(notes, fmt.Sprintf("- %s contended errors: %d, first: %s\n", n, r.errors, r.firstErr))
		}
	}
	for _, note := range notes {
		b.WriteString(note)
	}
	if missed == 0 {
		b.WriteString("\nlockwarden meets every target in this run.\n")
	} else {
		fmt.Fprintf(&b, "\nlockwarden misses %d target(s) in this run (marked **NO** above).\n", missed)
	}
	return report{text: b.String(), missed: missed}
}

// thinkNote says why the think time does not enter the limit, or warns
// that with these settings it may.
func thinkNote(cfg config, cycle time.Duration) string {
	others := cfg.clients - 1
	if time.Duration(others)*cycle > cfg.think {
		return fmt.Sprintf("The think time does not enter: with %d clients contending, the other %d are queued while the releaser thinks (%d × (hold + trip) = %s > think %v), so a handover waits for nobody's think.",
			cfg.clients, others, others, fmtDur(time.Duration(others)*cycle), cfg.think)
	}
	return fmt.Sprintf("Caution: with these settings the think time may enter (%d other clients × (hold + trip) = %s ≤ think %v: the queue can run empty), so the limit overstates what is reachable.",
		others, fmtDur(time.Duration(others)*cycle), cfg.think)
}

func holdMedian(cont map[string]*contendedResult) string {
	return fmtDur(holdMedianDur(cont))
}

// holdMedianDur is the median measured hold over every library's contended
// acquisitions (all are driven by the same pause).
func holdMedianDur(cont map[string]*contendedResult) time.Duration {
	var all durations
	for _, r := range cont {
		all = append(all, r.holds...)
	}
	return all.sorted().pct(50)
}

func evalCheck(unc *uncontendedResult, cont map[string]*contendedResult) string {
	// The hook and INFO snapshots of a contended window are a round trip
	// apart while traffic goes on, so allow a few commands either way.
	worst, where := 0.0, ""
	check := func(what string, s sent) {
		h, sv := float64(s.hook.evals), float64(s.server.evals())
		if d := math.Abs(h-sv) / math.Max(1, sv); d > worst {
			worst, where = d, fmt.Sprintf("%s: hook %d vs server %d", what, s.hook.evals, s.server.evals())
		}
	}
	for name, s := range unc.sent {
		check("uncontended "+name, s)
	}
	for name, r := range cont {
		check("contended "+name, r.sent())
	}
	if worst == 0 {
		return "they agree exactly in every window"
	}
	if worst < 0.01 {
		return fmt.Sprintf("they agree within %.2f%% (largest gap: %s)", worst*100, where)
	}
	return fmt.Sprintf("MISMATCH of %.1f%% (%s)", worst*100, where)
}

func failedNote(p peerMany) string {
	if p.failed == 0 {
		return ""
	}
	return fmt.Sprintf("; %d failed", p.failed)
}

// linearSlack is how far a per-lock growth factor may stray from 1 and still
// be called linear: each size is observed for a few seconds on a machine
// that may be noisy.
const linearSlack = 1.25

func buildScaleReport(cfg config, srv *redisServer, rows []*scaleRow) report {
	missed := 0
	var b strings.Builder
	fmt.Fprintf(&b, "\n## lockbench: watchdog scale, one lockwarden client holding N locks\n\n")
	fmt.Fprintf(&b, "Redis %s on loopback; %s, GOMAXPROCS=%d; WatchdogLease %v, RenewInterval %v, RenewBatchSize 100; %d intervals observed per size; %s.\n\n",
		srv.Version, runtime.Version(), runtime.GOMAXPROCS(0), cfg.scaleLease, cfg.scaleInterval, cfg.intervals, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	b.WriteString("| locks held | round trips per interval | renewals per interval | sweep median / max | client CPU per s (median interval) | client CPU per s per 1,000 locks | redis-server CPU per s (median interval) | live heap, holding − before | heap per lock | renewal goroutines | leases lost | checks pass? |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	about := func(v, want float64) bool { return math.Abs(v-want) <= want*renewSlackPercent/100 }
	for _, r := range rows {
		rt, ren := r.perInterval(r.roundTrips), r.perInterval(r.renewals)
		wantRT := math.Ceil(float64(r.n) / targetRenewBatch)
		took := r.sweepTook()
		var fails []string
		fail := func(format string, args ...any) {
			missed++
			fails = append(fails, fmt.Sprintf(format, args...))
		}
		if !about(rt, wantRT) {
			fail("%s round trips per interval, not ≈ %s", fmtFloat(rt), fmtInt(int64(wantRT)))
		}
		if !about(ren, float64(r.n)) {
			fail("%s renewals per interval, not ≈ %s", fmtFloat(ren), fmtInt(int64(r.n)))
		}
		if len(r.sweeps) != r.intervals || took.max() >= cfg.scaleInterval {
			fail("%d sweeps in %d intervals, longest %s", len(r.sweeps), r.intervals, fmtDur(took.max()))
		}
		if r.renewLoops != 1 {
			fail("%d renewal loops", r.renewLoops)
		}
		if r.leasesLost > 0 || r.stillHeld != r.n {
			fail("%d leases lost, %s of %s lock keys present", r.leasesLost, fmtInt(int64(r.stillHeld)), fmtInt(int64(r.n)))
		}
		verdict := "yes"
		if len(fails) > 0 {
			verdict = "**NO** — " + strings.Join(fails, "; ")
		}
		cpu := r.clientCPU()
		fmt.Fprintf(&b, "| %s | %s | %s (server: %s EVALSHA) | %s / %s | %s/s | %s/s | %s/s | %s | %s | %d (all goroutines vs before New: %+d) | %d | %s |\n",
			fmtInt(int64(r.n)), fmtFloat(rt), fmtFloat(ren), fmtFloat(r.perInterval(r.serverEvals)),
			fmtDur(took.pct(50)), fmtDur(took.max()),
			fmtDur(cpu), fmtDur(time.Duration(float64(cpu)*1000/float64(r.n))), fmtDur(r.serverCPU()),
			fmtBytes(r.heapDelta()), fmtBytes(r.heapDelta()/int64(r.n)),
			r.renewLoops, r.goroutines, r.leasesLost, verdict)
	}

	fmt.Fprintf(&b, "\nLinear growth: each ratio below ≈ the ratio of locks held (per-lock factor ≈ 1), i.e. round trips, CPU and heap per 1,000 locks stay about constant down the table. Fixed costs (the Go runtime's and redis-server's background work, which go on with no locks held) pull the factor between the smaller sizes below 1; a per-lock factor within %.0f%% of 1 either way is called linear here.\n\n",
		(linearSlack-1)*100)
	if len(rows) < 2 {
		b.WriteString("Only one size was run, so there are no ratios.\n")
	}
	for i := 1; i < len(rows); i++ {
		a, z := rows[i-1], rows[i]
		locks := float64(z.n) / float64(a.n)
		growth := func(name string, va, vz float64) string {
			if va <= 0 || vz <= 0 {
				return name + " n/a"
			}
			f := vz / va / locks
			kind := "linear"
			switch {
			case f > linearSlack:
				kind = "superlinear"
			case f < 1/linearSlack:
				kind = "sublinear"
			}
			return fmt.Sprintf("%s %.1f× (per lock %.2f: %s)", name, vz/va, f, kind)
		}
		fmt.Fprintf(&b, "- %s:%s locks (%.1f×): %s\n", fmtInt(int64(z.n)), fmtInt(int64(a.n)), locks, strings.Join([]string{
			growth("round trips", float64(a.roundTrips), float64(z.roundTrips)),
			growth("renewals", float64(a.renewals), float64(z.renewals)),
			growth("sweep median", float64(a.sweepTook().pct(50)), float64(z.sweepTook().pct(50))),
			growth("client CPU/s", float64(a.clientCPU()), float64(z.clientCPU())),
			growth("redis-server CPU/s", float64(a.serverCPU()), float64(z.serverCPU())),
			growth("live heap", float64(a.heapDelta()), float64(z.heapDelta())),
		}, ", "))
	}

	var took []string
	for _, r := range rows {
		took = append(took, fmt.Sprintf("%s in %s", fmtInt(int64(r.n)), fmtDur(r.acquireTook)))
	}
	b.WriteString("\nHow this was measured:\n\n")
	fmt.Fprintf(&b, "- Per size: the server is FLUSHALLed; one go-redis client with the counting hook and one lockwarden client on it (lw.New, options as above); one Mutex per lock, each TryLock(ctx, 0) once by 8 goroutines (%s). The client then only holds the locks.\n", strings.Join(took, ", "))
	fmt.Fprintf(&b, "- The window spans %d renewal ticks, from a tenth of an interval before a tick to the same point before a later tick, so it holds whole sweeps if a sweep takes under 0.9 intervals; it starts at least an interval after the last acquisition and ends at least a lease after it. Per interval = window count ÷ %d. Round trips = hook-counted Process calls + pipeline executions; renewals = EVALSHAs sent (server: INFO commandstats delta). A sweep = pipelines less than a twentieth of an interval apart, from the first one's start to the last one's end; the check wants one sweep per tick, each shorter than the interval.\n",
		cfg.intervals, cfg.intervals)
	b.WriteString("- Client CPU = getrusage(RUSAGE_SELF) user+sys per interval of the window ÷ its wall time, median over the intervals: the whole bench process, which only holds the locks then, so it includes the hook's counting and the Go runtime (GC, timers). redis-server CPU the same way from INFO cpu.\n")
	b.WriteString("- Live heap = runtime.MemStats.HeapAlloc after two runtime.GC() calls, taken after New (with the client's connections already open) and again right after the window, between sweeps. The difference covers the Mutexes (one per lock, as a caller keeps them), their Holds with their contexts and timers, the client's map entries, and the harness's two pointer slices (16 B per lock).\n")
	b.WriteString("- Renewal goroutines = goroutines running (*Client).renewLoop while holding. Leases lost = Holds whose Err() is set after the window; the check also wants every lock key still in Redis, which, taken more than a lease earlier, is there only if renewed.\n")
	if missed == 0 {
		b.WriteString("\nEvery scale check passes in this run.\n")
	} else {
		fmt.Fprintf(&b, "\n%d scale check(s) fail in this run (marked **NO** above).\n", missed)
	}
	return report{text: b.String(), missed: missed}
}
