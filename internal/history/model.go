// Package history checks histories of calls on one distributed lock for
// linearizability with porcupine, against a model of a reentrant lock with
// leases, owners and fencing tokens: what every client was told must be
// explained by one order of the calls in which each call takes effect at
// one moment between its start and its end, and the lock behaves as a lock.
//
// A history holds the calls of lockwarden clients (Lock, Unlock, Inspect),
// what each Hold said of itself (its last Err() == nil and when Err() turned
// non-nil), the calls of Redisson-script clients on the same lock, and the
// faults a nemesis struck (data loss, ForceRelease by another client, Close
// of a client), each with the interval in which it struck. Judged are only
// the clients' own answers and times, never the library's internals.
package history

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// never is a time after every operation.
const never int64 = math.MaxInt64

// Kind is what an operation is.
type Kind uint8

const (
	// Lock is a lockwarden Lock or TryLock (Input.Wait), re-entering the
	// ownership whose token is Input.Token if its context carried that
	// Hold (WithHold), else 0.
	Lock Kind = iota
	// Unlock is a Hold's Unlock; Input.Token is the Hold's token.
	Unlock
	// Alive is the last time a Hold's Err() returned nil. Err() is nil only
	// while the Hold's ownership is the lock's.
	Alive
	// Death is when a Hold's Err() turned non-nil: it was nil at Call
	// (the end of the Alive before it) and non-nil by Return. From then on
	// nobody vouches for the ownership, and its lease may run out.
	Death
	// Inspect reads the lock: free, or who holds it.
	Inspect
	// DataLoss is Redis losing the lock's keys within the interval
	// (FLUSHALL, or a restart without persistence).
	DataLoss
	// ForceRelease is ForceRelease(name, client ID of Input.Client) by a
	// client of its own (an operator's, the controller's), or with
	// Input.Own by that client itself, which ends its Holds before it
	// releases, as Close does.
	ForceRelease
	// Close is Client.Close of the lockwarden client Input.Client.
	Close
	// RedissonLock is a Redisson-script client's fenced lock for owner
	// Input.Owner, with a fixed lease that runs out at Input.Expiry at the
	// earliest.
	RedissonLock
	// RedissonUnlock is its unlock.
	RedissonUnlock
	// Failover is the lock's master failing over to its replica within the
	// interval. The replica may lack the master's last writes: the lock may
	// keep its holder, lose it, or come back as it was a moment earlier,
	// held for an owner that has since let it go.
	Failover
)

var kindNames = [...]string{"Lock", "Unlock", "Alive", "Death", "Inspect", "DataLoss", "ForceRelease", "Close", "RedissonLock", "RedissonUnlock", "Failover"}

func (k Kind) String() string { return kindNames[k] }

// Input is an operation's call.
type Input struct {
	Kind Kind
	// Client is the lockwarden client (an index unique in the history) the
	// call was made on, or that ForceRelease and Close act on.
	Client int
	// Worker names who made the call, for the printed history.
	Worker string
	// Wait is a Lock's wait: -1 for Lock, otherwise TryLock's bound.
	Wait time.Duration
	// Token is the Hold's fencing token for Unlock, Alive and Death; for a
	// Lock through WithHold, the token of the Hold it re-enters.
	Token int64
	// Owner is a Redisson-script client's owner, above 0.
	Owner int
	// Own marks a ForceRelease made by the client it names.
	Own bool
	// Waiting marks a ForceRelease during which a Lock call on the client
	// it names was in flight. Redis may have handed that call the lock, and
	// the ForceRelease removed the hand-over before the call took it: the
	// call then goes on waiting, and may return a later grant.
	Waiting bool
	// Expiry is, for RedissonLock, when its lease can run out at the
	// earliest (the send of the attempt that took the lock, plus the
	// lease); for DataLoss and ForceRelease, when the Holds whose ownership
	// they removed must have learned it (the fault's end plus a lease:
	// their local deadline passed by then).
	Expiry int64
	// Call and Return are the operation's times, which the model needs
	// for its rules that depend on time.
	Call, Return int64
}

// Result is what an operation answered.
type Result uint8

const (
	// OK: granted (Lock), released (Unlock), freed (RedissonUnlock), read
	// (Inspect), removed (ForceRelease), done (DataLoss, Close, Alive, Death).
	OK Result = iota
	// Timeout is TryLock's ErrWaitTimeout.
	Timeout
	// NotCurrent is Unlock's ErrNotOwner or ErrNotHeld, and a
	// RedissonUnlock that freed nothing: the ownership was not the lock's
	// when the call took effect, and nothing changed.
	NotCurrent
	// Nothing is an error that says the call did nothing (ErrClosed at the
	// start of a call, ErrLeaseMismatch).
	Nothing
	// Unknown is an error that leaves the outcome unknown (ErrUnavailable,
	// a context's end, a lost reply): the call may have taken effect, or
	// not at all. A Lock's may take effect at any time after its start: a
	// copy of its request may arrive late. That is modelled by the lock
	// being free to be held for nobody from then on (State.Phantoms), rather
	// than by an operation that never returns, which porcupine would try at
	// every point of the history.
	Unknown
)

var resultNames = [...]string{"ok", "timeout", "not-current", "nothing", "unknown"}

func (r Result) String() string { return resultNames[r] }

// Output is an operation's answer.
type Output struct {
	Result Result
	// Token is a granted Lock's or RedissonLock's fencing token, or the
	// token Inspect read from a lockwarden holder.
	Token int64
	// Removed is how many holders ForceRelease removed.
	Removed int
	// Holder is what Inspect saw: free, a lockwarden holder (Token), or a
	// Redisson-script holder (Owner).
	Holder HolderKind
	Owner  int
	// Err is the error's text, for the printed history.
	Err string
}

// HolderKind is who holds the lock in the model.
type HolderKind uint8

const (
	Free HolderKind = iota
	// Held by a lockwarden ownership some Hold vouches for.
	Held
	// Orphan is held for nobody: a Lock whose outcome is unknown took it,
	// or a release Redis was not told of left it. Nobody renews it, so its
	// lease may run out at any time. Its token is 0 when unknown.
	Orphan
	// Foreign is held by a Redisson-script client.
	Foreign
)

var holderNames = [...]string{"free", "held", "orphan", "redisson"}

// maxStale is how many ownerships Redis may have lost while their Holds
// still vouch for them, at once, in one history.
const maxStale = 8

// stale is an ownership Redis lost (data loss, another client's
// ForceRelease) whose Holds may still have Err() == nil until deadline:
// they learn of it at their next renewal, or at their local deadline.
type stale struct {
	token    int64
	deadline int64
}

// State is the lock as the model has it.
type State struct {
	Holder HolderKind
	// Client is the holder's lockwarden client (Held, Orphan); Owner the
	// Redisson-script owner (Foreign).
	Client, Owner int
	// Token is the holder's fencing token (0: unknown, for an orphan).
	Token int64
	// Levels is how many Holds of the ownership are not yet unlocked.
	Levels int
	// Extra is set when Redis may count a level no Hold accounts for (a
	// re-entry or an Unlock whose outcome is unknown): the last Unlock may
	// then leave the lock held for nobody.
	Extra bool
	// Lapsable is set once a Hold of the ownership stopped vouching for it
	// (Death): its lease may run out at any time.
	Lapsable bool
	// Expiry is when a Foreign holder's lease may run out.
	Expiry int64
	// Last is the highest fencing token granted so far: a new ownership's
	// must be above it.
	Last int64
	// Stale are ownerships Redis lost whose Holds may still vouch for them.
	Stale  [maxStale]stale
	nStale int
	// Phantoms has bit c set once a Lock of client c (bit 0: of a
	// Redisson-script client) had an unknown outcome: from then on, a free
	// lock may be held for nobody by that client's owner at any time. Bit
	// 63 (anyPhantom) stands for every client.
	Phantoms uint64
}

// anyClient is the client of an orphan that may be any client's.
const anyClient = -2

const anyPhantom = 1 << 63

// phantom is Phantoms' bit for a client; clients beyond 62 share bit 62.
func phantom(client int) uint64 { return 1 << min(max(client, 0), 62) }

// phantomClient is the client of Phantoms' bit c.
func phantomClient(c int) int {
	if c == 63 {
		return anyClient
	}
	return c
}

func (s State) free() State {
	s.Holder, s.Client, s.Owner, s.Token, s.Levels, s.Extra, s.Lapsable, s.Expiry = Free, 0, 0, 0, 0, false, false, 0
	return s
}

func (s State) orphan(client int, token int64) State {
	s = s.free()
	s.Holder, s.Client, s.Token = Orphan, client, token
	return s
}

// lose removes the holder, as Redis losing its keys does; a lockwarden
// ownership's Holds may vouch for it until deadline.
func (s State) lose(deadline int64) State {
	if s.Holder == Held {
		if s.nStale == maxStale {
			panic(fmt.Sprintf("history: more than %d ownerships lost at once; raise maxStale", maxStale))
		}
		s.Stale[s.nStale] = stale{s.Token, deadline}
		s.nStale++
	}
	return s.free()
}

// current reports whether the ownership with token t holds the lock.
func (s State) current(t int64) bool { return s.Holder == Held && s.Token == t }

// vouched reports whether a Hold with token t may say Err() == nil in a call
// made at call: its ownership holds the lock (or an orphan level of it
// does), or Redis lost it so recently that the Hold cannot know yet.
func (s State) vouched(t int64, call int64) bool {
	if (s.Holder == Held || s.Holder == Orphan) && s.Token == t {
		return true
	}
	for _, st := range s.Stale[:s.nStale] {
		if st.token == t && call <= st.deadline {
			return true
		}
	}
	return false
}

// ofClient reports whether the holder is an ownership of lockwarden client
// c, and whether it may be (an orphan that may be any client's).
func (s State) ofClient(c int) (is, may bool) {
	is = (s.Holder == Held || s.Holder == Orphan) && s.Client == c
	return is, is || s.Holder == Orphan && s.Client == anyClient
}

// lapses returns the states s may be in when an operation returning at ret
// takes effect: s, or free if its holder's lease may have run out by then;
// and if free, held for nobody by a Lock of unknown outcome.
func lapses(s State, ret int64) []State {
	next := []State{s}
	switch {
	case s.Holder == Orphan, s.Holder == Held && s.Lapsable, s.Holder == Foreign && ret >= s.Expiry:
		s = s.free()
		next = append(next, s)
	}
	if s.Holder == Free {
		for c := 0; c < 64; c++ {
			if s.Phantoms&(1<<c) != 0 {
				next = append(next, s.orphan(phantomClient(c), 0))
			}
		}
	}
	return next
}

// step applies one operation to a state in which nothing lapses.
func step(s State, in Input, out Output) []State {
	switch in.Kind {
	case Lock:
		switch out.Result {
		case OK:
			t := out.Token
			if in.Token != 0 && t == in.Token {
				// A re-entry keeps the ownership's token.
				if !s.current(t) {
					return nil
				}
				s.Levels++
				s.Lapsable = false
				return []State{s}
			}
			// A new ownership: the lock was free, and its token is above
			// every earlier one.
			if s.Holder != Free || t <= s.Last {
				return nil
			}
			s.Holder, s.Client, s.Token, s.Levels, s.Last = Held, in.Client, t, 1, t
			return []State{s}
		case Timeout:
			if in.Wait == 0 {
				// A single attempt that found the lock held.
				if s.Holder == Free {
					return nil
				}
				return []State{s}
			}
			// A waiter handed the lock just as it gave up, whose leave
			// Redis did not get, leaves it held for nobody.
			if s.Holder == Free {
				return []State{s, s.orphan(in.Client, 0)}
			}
			return []State{s}
		case Nothing:
			return []State{s}
		default: // Unknown
			s.Phantoms |= phantom(in.Client)
			next := []State{s}
			if in.Token != 0 && s.current(in.Token) {
				e := s
				e.Extra = true
				next = append(next, e)
			}
			return next
		}
	case Unlock:
		t := in.Token
		switch out.Result {
		case OK:
			if !s.current(t) || s.Levels < 1 {
				return nil
			}
			return unlockLevel(s, false)
		case NotCurrent:
			if s.current(t) {
				return nil
			}
			return []State{s}
		case Nothing:
			return []State{s}
		default: // Unknown: the Hold's level is given up in the client
			if !s.current(t) || s.Levels < 1 {
				return []State{s}
			}
			return unlockLevel(s, true)
		}
	case Alive:
		if !s.vouched(in.Token, in.Call) {
			return nil
		}
		return []State{s}
	case Death:
		if s.current(in.Token) {
			s.Lapsable = true
		}
		return []State{s}
	case Inspect:
		switch out.Holder {
		case Free:
			if s.Holder != Free {
				return nil
			}
		case Held:
			switch {
			case s.Holder == Held && s.Token == out.Token:
			case s.Holder == Orphan && (s.Token == 0 || s.Token == out.Token):
				s.Token = out.Token
			default:
				return nil
			}
		case Foreign:
			if s.Holder != Foreign || s.Owner != out.Owner {
				return nil
			}
		}
		return []State{s}
	case DataLoss:
		return []State{s.lose(in.Expiry)}
	case Failover:
		// An earlier holder that came back is held for nobody, of any
		// client: from now on, as after a Lock of unknown outcome.
		lost := s.lose(in.Expiry)
		lost.Phantoms |= anyPhantom
		return []State{s, lost}
	case ForceRelease:
		is, may := s.ofClient(in.Client)
		lost := s.lose(in.Expiry)
		if in.Own {
			// The client's own Holds end before the release.
			lost = s.free()
		}
		switch {
		case out.Result == Unknown && may:
			return []State{s, lost}
		case out.Result == Unknown:
			return []State{s}
		case out.Removed > 0 && may:
			return []State{lost}
		case out.Removed > 0 && in.Waiting && s.Holder == Free:
			// It removed a hand-over no call had taken: no Hold knew it.
			return []State{s}
		case out.Removed == 0 && !is:
			return []State{s}
		}
		return nil
	case Close:
		is, may := s.ofClient(in.Client)
		switch {
		case is:
			// Released, or left to run out if Redis did not get the
			// release.
			return []State{s.free(), s.orphan(s.Client, s.Token)}
		case may:
			return []State{s, s.free()}
		}
		return []State{s}
	case RedissonLock:
		switch out.Result {
		case OK:
			if s.Holder != Free {
				return nil
			}
			last := max(s.Last, out.Token)
			s = s.free()
			s.Holder, s.Owner, s.Expiry, s.Last = Foreign, in.Owner, in.Expiry, last
			return []State{s}
		case Unknown:
			s.Phantoms |= phantom(0)
		}
		return []State{s}
	case RedissonUnlock:
		mine := s.Holder == Foreign && s.Owner == in.Owner
		switch out.Result {
		case OK:
			if !mine {
				return nil
			}
			return []State{s.free()}
		case NotCurrent:
			if mine {
				return nil
			}
			return []State{s}
		default:
			if mine {
				return []State{s, s.free()}
			}
			return []State{s}
		}
	}
	panic(fmt.Sprintf("history: unknown operation kind %d", in.Kind))
}

// unlockLevel undoes one Hold's level of the current ownership; the last
// frees the lock, or leaves it held for nobody if Redis may count a level
// no Hold accounts for, or if the release's outcome is unknown.
func unlockLevel(s State, unknown bool) []State {
	s.Levels--
	if unknown {
		s.Extra = true
	}
	if s.Levels > 0 {
		return []State{s}
	}
	if s.Extra {
		return []State{s.free(), s.orphan(s.Client, s.Token)}
	}
	return []State{s.free()}
}

// Model is the lock's model for porcupine.
var Model = porcupine.NondeterministicModel{
	Init: func() []any { return []any{State{}} },
	Step: func(state, input, output any) []any {
		in, out := input.(Input), output.(Output)
		var next []any
		for _, s := range lapses(state.(State), in.Return) {
			for _, n := range step(s, in, out) {
				next = append(next, n)
			}
		}
		return next
	},
	Equal: func(a, b any) bool { return a.(State) == b.(State) },
	Hash: func(state any) uint64 {
		h := fnv.New64a()
		fmt.Fprint(h, state.(State))
		return h.Sum64()
	},
	DescribeOperation: func(input, output any) string { return Describe(input.(Input), output.(Output)) },
	DescribeState:     func(state any) string { return state.(State).String() },
}

// Describe tells an operation in one line.
func Describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case Lock:
		switch {
		case in.Wait < 0:
			call = "Lock"
		default:
			call = fmt.Sprintf("TryLock(%v)", in.Wait)
		}
		if in.Token != 0 {
			call += fmt.Sprintf(" re-entering %d", in.Token)
		}
		call += fmt.Sprintf(" on client %d", in.Client)
	case Unlock, Alive, Death:
		call = fmt.Sprintf("%s(%d)", in.Kind, in.Token)
	case ForceRelease, Close:
		call = fmt.Sprintf("%s(client %d)", in.Kind, in.Client)
		if in.Own {
			call += " by itself"
		}
		if in.Waiting {
			call += ", a Lock of it waiting"
		}
	case RedissonLock, RedissonUnlock:
		call = fmt.Sprintf("%s(owner %d)", in.Kind, in.Owner)
	default:
		call = in.Kind.String()
	}
	if in.Worker != "" {
		call = in.Worker + ": " + call
	}
	var ans string
	switch {
	case out.Result == OK && (in.Kind == Lock || in.Kind == RedissonLock):
		ans = fmt.Sprintf("granted %d", out.Token)
	case in.Kind == Inspect:
		ans = holderNames[out.Holder]
		switch out.Holder {
		case Held:
			ans += fmt.Sprintf(" %d", out.Token)
		case Foreign:
			ans += fmt.Sprintf(" owner %d", out.Owner)
		}
	case in.Kind == ForceRelease && out.Result == OK:
		ans = fmt.Sprintf("removed %d", out.Removed)
	case in.Kind == Alive:
		ans = "Err() == nil"
	case in.Kind == Death:
		ans = "Err() != nil"
	default:
		ans = out.Result.String()
	}
	if out.Err != "" {
		ans += " (" + out.Err + ")"
	}
	return call + " -> " + ans
}

func (s State) String() string {
	var b strings.Builder
	b.WriteString(holderNames[s.Holder])
	switch s.Holder {
	case Held, Orphan:
		fmt.Fprintf(&b, " client %d token %d", s.Client, s.Token)
		if s.Holder == Held {
			fmt.Fprintf(&b, " levels %d", s.Levels)
		}
		if s.Extra {
			b.WriteString(" +extra")
		}
		if s.Lapsable {
			b.WriteString(" lapsable")
		}
	case Foreign:
		fmt.Fprintf(&b, " owner %d", s.Owner)
	}
	fmt.Fprintf(&b, " last %d", s.Last)
	for _, st := range s.Stale[:s.nStale] {
		fmt.Fprintf(&b, " lost %d", st.token)
	}
	if s.Phantoms != 0 {
		fmt.Fprintf(&b, " phantoms %b", s.Phantoms)
	}
	return b.String()
}
