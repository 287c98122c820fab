package history

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// at is a time in the hand-made histories: milliseconds, as ns.
func at(ms float64) int64 { return int64(ms * 1e6) }

type recorder struct{ ops []porcupine.Operation }

// add records an operation from call to ret (ms).
func (r *recorder) add(lane int, in Input, call, ret float64, out Output) {
	in.Call, in.Return = at(call), at(ret)
	r.ops = append(r.ops, Op(lane, in, out))
}

func granted(t int64) Output { return Output{Token: t} }

var ok = Output{}

func check(t *testing.T, r *recorder, want porcupine.CheckResult) {
	t.Helper()
	v := Check(r.ops, 10*time.Second)
	if v.Result != want {
		t.Errorf("got %s, want %s for:\n%s", v.Result, want, Lines(r.ops))
		if v.Result == porcupine.Illegal {
			t.Log(Explain(r.ops, v))
		}
	}
}

// Each case is a history the model must reject, beside the one nearest to
// it that a correct lock may produce, which it must accept.
func TestModel(t *testing.T) {
	lease := 100.0
	// forceReleasedHandOver is client 1's Unlock handing the lock to client 2's
	// waiting Lock, whose hand-over a ForceRelease removes before the Lock
	// takes it; the Lock returns a later grant. waiting is whether the
	// ForceRelease is marked as made while a Lock of client 2 was in flight.
	forceReleasedHandOver := func(waiting bool) func(r *recorder) {
		return func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 9, granted(30))
			r.add(0, Input{Kind: Unlock, Token: 10}, 2, 3, ok)
			r.add(3, Input{Kind: ForceRelease, Client: 2, Waiting: waiting, Expiry: at(5 + lease)}, 4, 5, Output{Removed: 1})
			r.add(5, Input{Kind: Inspect}, 6, 7, Output{Holder: Free})
			r.add(1, Input{Kind: Unlock, Token: 30}, 10, 11, ok)
		}
	}
	for _, tc := range []struct {
		name string
		want porcupine.CheckResult
		ops  func(r *recorder)
	}{
		{"handover", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 8, granted(20))
			r.add(2, Input{Kind: Alive, Token: 10}, 5, 5.1, ok)
			r.add(2, Input{Kind: Death, Token: 10}, 5.1, 6.9, ok)
			r.add(0, Input{Kind: Unlock, Token: 10}, 6, 7, ok)
		}},
		{"case 1: Unlock nil after another client's ForceRelease", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(3, Input{Kind: ForceRelease, Client: 1, Expiry: at(3 + lease)}, 2, 3, Output{Removed: 1})
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 4, 5, granted(20))
			r.add(1, Input{Kind: Unlock, Token: 20}, 6, 7, ok)
			r.add(0, Input{Kind: Unlock, Token: 10}, 8, 9, ok)
		}},
		{"case 1 answered right: ErrNotHeld", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(3, Input{Kind: ForceRelease, Client: 1, Expiry: at(3 + lease)}, 2, 3, Output{Removed: 1})
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 4, 5, granted(20))
			r.add(1, Input{Kind: Unlock, Token: 20}, 6, 7, ok)
			r.add(2, Input{Kind: Alive, Token: 10}, 7.5, 7.6, ok) // it cannot know yet
			r.add(0, Input{Kind: Unlock, Token: 10}, 8, 9, Output{Result: NotCurrent})
		}},
		{"case 1 after data loss", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(3, Input{Kind: DataLoss, Expiry: at(3 + lease)}, 2, 3, ok)
			r.add(0, Input{Kind: Unlock, Token: 10}, 8, 9, ok)
		}},
		{"a Hold that cannot know of a data loss yet", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(3, Input{Kind: DataLoss, Expiry: at(3 + lease)}, 2, 3, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 4, 5, granted(20))
			r.add(2, Input{Kind: Alive, Token: 10}, 50, 50.1, ok)
		}},
		{"a failover that lost the holder, and brought an earlier one back", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(0, Input{Kind: Unlock, Token: 10}, 2, 3, ok)
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 4, 5, granted(20))
			r.add(3, Input{Kind: Failover, Expiry: at(9 + lease)}, 6, 9, ok)
			r.add(5, Input{Kind: Inspect}, 10, 11, Output{Holder: Held, Token: 10})
			r.add(1, Input{Kind: Lock, Client: 2}, 12, 13, Output{Result: Timeout})
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 14, 15, granted(30))
			r.add(2, Input{Kind: Alive, Token: 20}, 16, 16.1, ok)
		}},
		{"a failover's lost holder that should have learned of it", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(20))
			r.add(3, Input{Kind: Failover, Expiry: at(9 + lease)}, 6, 9, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 14, 15, granted(30))
			r.add(2, Input{Kind: Alive, Token: 20}, 160, 160.1, ok)
		}},
		{"a Hold that should have learned of a data loss", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(3, Input{Kind: DataLoss, Expiry: at(3 + lease)}, 2, 3, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 4, 5, granted(20))
			r.add(2, Input{Kind: Alive, Token: 10}, 150, 150.1, ok)
		}},
		{"a Hold alive after its own client's ForceRelease released it to another", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 5, granted(20))
			r.add(3, Input{Kind: ForceRelease, Client: 1, Own: true}, 3, 8, Output{Removed: 1})
			r.add(2, Input{Kind: Alive, Token: 10}, 6, 6.01, ok)
		}},
		{"a Hold alive after another client's ForceRelease released it to another", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 5, granted(20))
			r.add(3, Input{Kind: ForceRelease, Client: 1, Expiry: at(8 + lease)}, 3, 8, Output{Removed: 1})
			r.add(2, Input{Kind: Alive, Token: 10}, 6, 6.01, ok)
		}},
		{"a ForceRelease that removed a hand-over a waiting Lock had not taken", porcupine.Ok, forceReleasedHandOver(true)},
		{"a ForceRelease that removed a holder of a free lock", porcupine.Illegal, forceReleasedHandOver(false)},
		{"case 2: a Hold alive after Close released it to another", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 5, granted(20))
			r.add(3, Input{Kind: Close, Client: 1}, 3, 8, ok)
			r.add(2, Input{Kind: Alive, Token: 10}, 6, 6.01, ok)
			r.add(2, Input{Kind: Death, Token: 10}, 6.01, 7.5, ok)
		}},
		{"case 2 done right: the Hold ends first", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 5, granted(20))
			r.add(3, Input{Kind: Close, Client: 1}, 3, 8, ok)
			r.add(2, Input{Kind: Alive, Token: 10}, 3.1, 3.11, ok)
			r.add(2, Input{Kind: Death, Token: 10}, 3.11, 3.5, ok)
		}},
		{"case 5: ErrNotOwner for an Unlock that freed the lock", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 4, granted(20))
			r.add(0, Input{Kind: Unlock, Token: 10}, 3, 9, Output{Result: NotCurrent})
			r.add(2, Input{Kind: Alive, Token: 10}, 8, 8.01, ok)
			r.add(2, Input{Kind: Death, Token: 10}, 8.01, 9, ok)
		}},
		{"ErrNotOwner after the lease ran out during the Unlock", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 4, granted(20))
			r.add(0, Input{Kind: Unlock, Token: 10}, 3, 9, Output{Result: NotCurrent})
			r.add(2, Input{Kind: Alive, Token: 10}, 3.5, 3.51, ok)
			r.add(2, Input{Kind: Death, Token: 10}, 3.51, 3.6, ok)
		}},
		{"two Holds alive at once", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 2, granted(20))
			r.add(2, Input{Kind: Alive, Token: 10}, 3, 3.01, ok)
		}},
		{"a token that goes backwards", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(0, Input{Kind: Unlock, Token: 10}, 2, 3, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 4, 5, granted(5))
		}},
		{"a TryLock(0) refused by a lock held for nobody", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(0, Input{Kind: Unlock, Token: 10}, 2, 3, ok)
			r.add(1, Input{Kind: Lock, Client: 2}, 4, 5, Output{Result: Timeout})
		}},
		{"a TryLock(0) refused by what a Lock of unknown outcome took", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 0.5, Output{Result: Unknown})
			r.add(1, Input{Kind: Lock, Client: 2}, 4, 5, Output{Result: Timeout})
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 6, 7, granted(20))
		}},
		{"re-entries keep the lock until the last Unlock", porcupine.Ok, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(0, Input{Kind: Lock, Client: 1, Token: 10}, 2, 3, granted(10))
			r.add(0, Input{Kind: Unlock, Token: 10}, 4, 5, ok)
			r.add(0, Input{Kind: Unlock, Token: 10}, 6, 7, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 8, granted(20))
		}},
		{"a re-entry's Unlock that freed the lock", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(0, Input{Kind: Lock, Client: 1, Token: 10}, 2, 3, granted(10))
			r.add(0, Input{Kind: Unlock, Token: 10}, 4, 5, ok)
			r.add(1, Input{Kind: Lock, Client: 2, Wait: -1}, 0.5, 5.5, granted(20))
			r.add(0, Input{Kind: Unlock, Token: 10}, 6, 7, ok)
		}},
		{"a lockwarden grant while a Redisson client holds", porcupine.Illegal, func(r *recorder) {
			r.add(4, Input{Kind: RedissonLock, Owner: 1, Expiry: at(100)}, 0, 1, granted(10))
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 2, 3, granted(20))
		}},
		{"a lockwarden grant once a Redisson lease ran out", porcupine.Ok, func(r *recorder) {
			r.add(4, Input{Kind: RedissonLock, Owner: 1, Expiry: at(100)}, 0, 1, granted(10))
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 2, 101, granted(20))
			r.add(4, Input{Kind: RedissonUnlock, Owner: 1}, 102, 103, Output{Result: NotCurrent})
			r.add(5, Input{Kind: Inspect}, 104, 105, Output{Holder: Held, Token: 20})
		}},
		{"Inspect of a holder that cannot be", porcupine.Illegal, func(r *recorder) {
			r.add(0, Input{Kind: Lock, Client: 1, Wait: -1}, 0, 1, granted(10))
			r.add(5, Input{Kind: Inspect}, 2, 3, Output{Holder: Free})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			tc.ops(r)
			check(t, r, tc.want)
		})
	}
}
