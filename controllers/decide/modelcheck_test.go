package decide

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestModelCheck explores every interleaving of a small world up to a depth,
// not a random sample (controllers' TestModel drives the real reconciler on
// envtest through random histories; this one exhausts the orders of the
// steps that matter to who holds a key). The world: one key shared by lock
// A (namespace a) and lock B (namespace b); pods p0 and p1 in a behind A's
// gate, p1 also behind the gate of lock X of another key, p2 in b behind B's
// gate; two manager replicas, each reading through its own cache, which
// lags the API server until a step syncs it.
//
// A replica plays the controller's protocol, one step per read or write:
// it reads (its cache, and Redis), asks View.Resolve who holds the key and
// decides (release a stopped holder, keep the grantee's hold, take the key
// again for it, or grant the first candidate that may take it); it takes
// the key in Redis; before a gate would be lifted, it checks the locks past
// its cache; it records the grant on each lock, preconditioned on the
// resourceVersion it read; it lifts the gate once the lock records the
// lift; and it clears the records of grants whose pod it sees stopped.
// The API server applies the resourceVersion preconditions and the fencing
// policy (a lift whose token is below the lock's highestToken is refused);
// Redis keeps one ownership with its reentry count and fencing token, as
// the library's scripts do.
//
// The other steps: the kubelet starts a pod with no gate left, a
// container exits to be restarted in place (shown Terminated, then
// CrashLoopBackOff, the phase Running), is restarted, the pod completes; a
// pod is deleted (its kubelet learns of it a step later or more, and
// restarts containers until then; then it stops the pod and the object
// goes); Redis loses the key, or its lease runs out (the same to the model,
// which has no clock: the fencing counter lives on); Redis restarts empty,
// losing the key and its fencing counter, so the next tokens are below the
// recorded ones; lock A's selector is edited to leave p1 out; a replica
// restarts (its reconcile abandoned where it was, its memory gone, its
// cache listed afresh) with flags that no longer share the key with
// namespace b, so that lock B is refused the key while the other replica
// still shares it; lock X lifts its gate; lock B is created
// (after the replicas' caches were filled: the check past the cache reads
// only the locks a replica's cache knows), and deleted and created again
// once its finalizer lets it go (its status starts empty); each replica's
// cache catches up with the API server, in the order the API server wrote
// (a cache is a consistent prefix of one watch).
//
// The oracle is the world's own kubelet, never the controller's code. It
// fails when two guarded pods of the key run at once (a pod runs from the
// kubelet's start until it completes or is stopped, restarts in place
// included); when a gate is lifted for a grant the API server's record
// does not name; and when the controller releases the key (a give-back or
// a force release) while the pod holding it runs.
//
// Two faults at most happen in one exploration (deletions, losses, edits,
// restarts). LOCKWARDEN_MODELCHECK_DEPTH sets the depth (default
// modelDepth).
func TestModelCheck(t *testing.T) {
	depth := depthOf(t, modelDepth)
	start := time.Now()
	c := &checker{depthOf: map[mState]int8{}, depth: depth}
	c.run(initialState())
	t.Logf("depth %d: %d states explored, %d transitions, in %v", depth, len(c.depthOf), c.transitions, time.Since(start).Round(time.Millisecond))
	if c.failure != "" {
		t.Fatalf("after %d steps: %s\n%s", len(c.trace), c.failure, strings.Join(c.trace, "\n"))
	}
	if c.lifts == 0 || c.regrants == 0 {
		t.Fatalf("the exploration never lifted a gate (%d) or granted the key to a second pod (%d): it checks nothing", c.lifts, c.regrants)
	}
}

// TestModelCheckALockNotYetCached settles a suspicion: the check past the
// cache reads again only the locks the replica's cache knows, so a lock not
// yet cached, a Redis loss and a failover together might let two grants
// out. It explores every interleaving from the moment it would happen: r0
// granted the key to p2 through lock B, recorded it and lifted p2's gate,
// p2 runs, Redis lost the key, and r1's cache still shows the world before
// B was created. Every record is preconditioned on the resourceVersion its
// replica read, and each grant records its token on every lock it knows,
// so a replica whose cache lacks B has read A before r0's record on A and
// has its own record refused; the exploration finds no two running pods.
func TestModelCheckALockNotYetCached(t *testing.T) {
	s := initialState()
	before := s.api // r1's cache: B not created yet
	s.api.locks[1] = mLock{exists: true, rv: 3, grant: mGrant{pod: 2, token: 1, lifted: true}, highest: 1}
	s.api.locks[0].highest, s.api.locks[0].rv = 1, 2
	s.api.pods[2].gate, s.api.pods[2].kubelet, s.api.pods[2].rv = false, kRunning, 3
	s.redis = mRedis{holder: none, counter: 1}
	s.reps[0].cache, s.reps[1].cache = s.api, before
	s.faults = 1
	c := &checker{depthOf: map[mState]int8{}, depth: depthOf(t, notYetCachedDepth)}
	c.run(s)
	t.Logf("depth %d: %d states explored, %d transitions", c.depth, len(c.depthOf), c.transitions)
	if c.failure != "" {
		t.Fatalf("after %d steps: %s\n%s", len(c.trace), c.failure, strings.Join(c.trace, "\n"))
	}
}

// TestModelCheckFromBsRunningGrant explores every interleaving from a grant
// of the shared key through the second namespace's lock: r0 granted it to
// p2 through lock B, recorded the grant and its lift on both locks, and p2
// runs; both caches show it. From there the faults that concern such a
// grant come within reach of the depth make test explores: a replica
// restarting with flags that no longer share the key with namespace b (B is
// then refused the key, and its record of p2's grant must keep p2's grant
// while p2 runs), Redis losing the key or restarting empty (its fencing
// counter lost, so the next tokens are below the recorded ones), lock A's
// selector edited, p2 deleted or its container restarted in place.
func TestModelCheckFromBsRunningGrant(t *testing.T) {
	s := initialState()
	s.api.locks[1] = mLock{exists: true, rv: 3, grant: mGrant{pod: 2, token: 1, lifted: true}, highest: 1}
	s.api.locks[0].highest, s.api.locks[0].rv = 1, 2
	s.api.pods[2].gate, s.api.pods[2].kubelet, s.api.pods[2].rv = false, kRunning, 3
	s.redis = mRedis{holder: 2, count: 1, token: 1, counter: 1}
	s.reps[0].cache, s.reps[1].cache = s.api, s.api
	s.reps[0].memory = 2
	c := &checker{depthOf: map[mState]int8{}, depth: depthOf(t, fromBsGrantDepth)}
	c.run(s)
	t.Logf("depth %d: %d states explored, %d transitions", c.depth, len(c.depthOf), c.transitions)
	if c.failure != "" {
		t.Fatalf("after %d steps: %s\n%s", len(c.trace), c.failure, strings.Join(c.trace, "\n"))
	}
}

// fromBsGrantDepth is the depth make test explores from B's running grant
// (242,281 states at 7; 1,784,797 at 9).
const fromBsGrantDepth = 7

// depthOf is def, deepened by as many steps as LOCKWARDEN_MODELCHECK_DEPTH
// asks TestModelCheck for beyond modelDepth: the tests that start from a
// prepared state go as many steps deeper as the main one.
func depthOf(t *testing.T, def int) int {
	v := os.Getenv("LOCKWARDEN_MODELCHECK_DEPTH")
	if v == "" {
		return def
	}
	d, err := strconv.Atoi(v)
	if err != nil {
		t.Fatal(err)
	}
	return def + d - modelDepth
}

// notYetCachedDepth is the depth make test explores from a lock not yet
// cached: every record and lift either replica can attempt takes fewer
// steps (183,030 states at 8).
const notYetCachedDepth = 8

// modelDepth is the depth make test explores (1,169,484 states: about 25 s
// on a core, several times that under the race detector); make model-check
// goes deeper.
const modelDepth = 11

const (
	nPods     = 3
	nLocks    = 2 // A (namespace a), B (namespace b)
	nReplicas = 2
	none      = -1
	outsider  = 9 // a Redis owner that is no pod
)

// podNS and podLock are each pod's namespace and the lock of the key that
// gates and selects it.
var (
	podNS   = [nPods]string{"a", "a", "b"}
	podLock = [nPods]int8{0, 0, 1}
	lockNS  = [nLocks]string{"a", "b"}
	lockNm  = [nLocks]string{"A", "B"}
)

// kubelet states of a pod.
const (
	kNotStarted int8 = iota
	kRunning
	kExited  // its container exited, to be restarted in place: shown Terminated
	kBackOff // and waits for its restart: shown Waiting (CrashLoopBackOff)
	kDone    // terminal phase
)

// mPod is a pod as the API server has it, and its kubelet's state, which
// only the oracle and the pod's status read.
type mPod struct {
	gate, gateX bool // A's or B's gate; X's gate (p1 only)
	kubelet     int8
	restarts    int8
	deleting    bool
	seen        bool // its kubelet has seen the deletion, and reported on it
	gone        bool
	rv          int8
}

type mGrant struct {
	pod    int8 // none for no record
	token  int8
	lifted bool
}

type mLock struct {
	exists  bool
	rv      int8
	grant   mGrant
	highest int8
}

// mAPI is what the API server holds.
type mAPI struct {
	pods  [nPods]mPod
	locks [nLocks]mLock
	// deselected: lock A's candidate selector was edited to leave p1 out
	// (p1 keeps A's gate).
	deselected bool
}

// mRedis is the key's one ownership, as the library's scripts keep it.
type mRedis struct {
	holder  int8 // a pod, outsider, or none
	count   int8
	token   int8
	counter int8 // the fencing counter, which outlives the key
}

// Replica program counters.
const (
	pcIdle int8 = iota
	pcTake
	pcCheck
	pcRecordA
	pcRecordB
	pcLift
	pcRelease
	pcClear
)

type mReplica struct {
	cache  mAPI // what its cache shows
	view   mAPI // what this reconcile read (its copies, kept in step with its writes)
	pc     int8
	target int8
	token  int8
	took   bool // this reconcile took a level of the hold
	lift   bool // a gate will be lifted with this take
	memory int8 // the pod this process last granted the key to
	// unshared: this replica's flags no longer share the key with
	// namespace b (a new --shared-key rolls out one replica at a time), so
	// lock B is refused the key: it grants nothing, and its record of a
	// grant is kept until the pod stops.
	unshared bool
}

type mState struct {
	api     mAPI
	redis   mRedis
	reps    [nReplicas]mReplica
	faults  int8 // Redis losses and deletions left
	crashes int8 // container exits left
}

func initialState() mState {
	var s mState
	for i := range s.api.pods {
		s.api.pods[i].gate = true
		s.api.pods[i].rv = 1
	}
	s.api.pods[1].gateX = true
	for i := range s.api.locks {
		s.api.locks[i] = mLock{rv: 1, grant: mGrant{pod: none}}
	}
	s.api.locks[0].exists = true // B is created by a step
	s.redis = mRedis{holder: none}
	for i := range s.reps {
		s.reps[i] = mReplica{cache: s.api, pc: pcIdle, target: none, memory: none}
	}
	s.faults, s.crashes = 2, 1
	return s
}

type checker struct {
	// depthOf is each state reached, at the fewest steps it takes.
	depthOf     map[mState]int8
	depth       int
	transitions int
	lifts       int
	regrants    int
	trace       []string
	failure     string
}

// run explores every state within c.depth steps of init, breadth first,
// each once, and stops at the first failure, whose trace it keeps.
func (c *checker) run(init mState) {
	c.depthOf[init] = 0
	frontier := []mState{init}
	for d := 0; d < c.depth && len(frontier) > 0; d++ {
		var next []mState
		for _, s := range frontier {
			for _, st := range steps(s) {
				n, what, fail := st(s)
				if what == "" {
					continue
				}
				c.transitions++
				if fail == "" {
					fail = oracle(n)
				}
				if fail != "" {
					c.failure = fail
					c.trace = append(c.path(init, s, d, map[mState]bool{}), what)
					return
				}
				if strings.Contains(what, "lifts p") {
					c.lifts++
				}
				if strings.Contains(what, "takes the key for p1") || strings.Contains(what, "takes the key for p2") {
					c.regrants++
				}
				if _, ok := c.depthOf[n]; !ok {
					c.depthOf[n] = int8(d + 1)
					next = append(next, n)
				}
			}
		}
		frontier = next
	}
}

// path is the steps from s, d steps from the start, to target: through
// states first reached one step further each.
func (c *checker) path(s, target mState, d int, tried map[mState]bool) []string {
	if d == 0 {
		if s == target {
			return []string{}
		}
		return nil
	}
	for _, st := range steps(s) {
		n, what, _ := st(s)
		if what == "" || tried[n] || (n != target && int(c.depthOf[n]) != int(c.depthOf[s])+1) {
			continue
		}
		tried[n] = true
		if rest := c.path(n, target, d-1, tried); rest != nil {
			return append([]string{what}, rest...)
		}
	}
	return nil
}

// step plays one step; what is "" if it is not enabled; fail names what the
// oracle saw fail during the step.
type step func(mState) (next mState, what, fail string)

func steps(s mState) []step {
	var out []step
	for r := range nReplicas {
		out = append(out, func(s mState) (mState, string, string) {
			s, what, fail := replicaStep(s, r)
			if rep := &s.reps[r]; rep.pc == pcIdle {
				// What a finished reconcile read is forgotten: states that
				// differ only by it are one.
				rep.view, rep.target, rep.token, rep.took, rep.lift = mAPI{}, none, 0, false, false
			}
			return s, what, fail
		})
		out = append(out, func(s mState) (mState, string, string) {
			if s.reps[r].cache == s.api {
				return s, "", ""
			}
			s.reps[r].cache = s.api
			return s, fmt.Sprintf("r%d's cache catches up", r), ""
		})
	}
	for p := range nPods {
		out = append(out, kubeletSteps(p)...)
		out = append(out, func(s mState) (mState, string, string) {
			pod := &s.api.pods[p]
			if s.faults == 0 || pod.deleting || pod.gone {
				return s, "", ""
			}
			s.faults--
			pod.deleting, pod.rv = true, pod.rv+1
			if pod.kubelet == kNotStarted || pod.kubelet == kDone {
				pod.gone = true // unbound, or stopped: the object goes at once
			}
			return s, fmt.Sprintf("p%d is deleted", p), ""
		})
	}
	out = append(out, func(s mState) (mState, string, string) {
		if s.faults == 0 || s.redis.holder == none {
			return s, "", ""
		}
		s.faults--
		s.redis.holder, s.redis.count, s.redis.token = none, 0, 0
		return s, "Redis loses the key, or its lease runs out (a replica's renewals fail)", ""
	})
	out = append(out, func(s mState) (mState, string, string) {
		// The counter goes with the key: tokens start again below the
		// ones recorded (and the clock, which they follow, is behind).
		if s.faults == 0 || s.redis.counter == 0 {
			return s, "", ""
		}
		s.faults--
		s.redis = mRedis{holder: none}
		return s, "Redis restarts empty: the key and its fencing counter are lost", ""
	})
	out = append(out, func(s mState) (mState, string, string) {
		if s.faults == 0 || s.api.deselected {
			return s, "", ""
		}
		s.faults--
		s.api.deselected, s.api.locks[0].rv = true, s.api.locks[0].rv+1
		return s, "lock A's selector is edited to leave p1 out", ""
	})
	for r := range nReplicas {
		out = append(out, func(s mState) (mState, string, string) {
			if s.faults == 0 || s.reps[r].unshared {
				return s, "", ""
			}
			// The restart ends its reconcile where it was, and forgets
			// its grants; its new cache starts from a full list.
			s.faults--
			s.reps[r] = mReplica{cache: s.api, pc: pcIdle, target: none, memory: none, unshared: true}
			return s, fmt.Sprintf("r%d restarts with flags that no longer share the key with namespace b", r), ""
		})
	}
	out = append(out, func(s mState) (mState, string, string) {
		b := &s.api.locks[1]
		if b.exists {
			return s, "", ""
		}
		b.exists, b.rv = true, b.rv+1
		return s, "lock B is created", ""
	})
	out = append(out, func(s mState) (mState, string, string) {
		// A lock's finalizer keeps it while the pod whose gate it lifted
		// runs; deleted and created again, it starts with an empty status.
		b := &s.api.locks[1]
		if s.faults == 0 || !b.exists {
			return s, "", ""
		}
		if g := b.grant; g.pod != none && g.lifted && !s.api.pods[g.pod].gone && s.api.pods[g.pod].kubelet != kDone {
			return s, "", ""
		}
		s.faults--
		*b = mLock{exists: true, rv: b.rv + 1, grant: mGrant{pod: none}}
		return s, "lock B is deleted and created again", ""
	})
	out = append(out, func(s mState) (mState, string, string) {
		pod := &s.api.pods[1]
		if !pod.gateX || pod.gone {
			return s, "", ""
		}
		pod.gateX, pod.rv = false, pod.rv+1
		return s, "lock X lifts its gate from p1", ""
	})
	return out
}

// kubeletSteps are the moves of the pod's kubelet: start a pod with no
// gate left, let its container exit (to be restarted in place), restart it,
// complete the pod, or stop it for its deletion (the object then goes).
func kubeletSteps(p int) []step {
	move := func(ok func(mState, *mPod) bool, act func(*mState, *mPod), what string) step {
		return func(s mState) (mState, string, string) {
			pod := &s.api.pods[p]
			if pod.gone || !ok(s, pod) {
				return s, "", ""
			}
			act(&s, pod)
			pod.rv++
			return s, fmt.Sprintf(what, p), ""
		}
	}
	return []step{
		move(func(_ mState, pod *mPod) bool {
			return pod.kubelet == kNotStarted && !pod.gate && !pod.gateX && !pod.deleting
		}, func(_ *mState, pod *mPod) { pod.kubelet = kRunning }, "kubelet starts p%d"),
		move(func(s mState, pod *mPod) bool { return pod.kubelet == kRunning && !pod.seen && s.crashes > 0 },
			func(s *mState, pod *mPod) { s.crashes--; pod.kubelet = kExited },
			"p%d's container exits, to be restarted in place"),
		move(func(_ mState, pod *mPod) bool { return pod.kubelet == kExited && !pod.seen },
			func(_ *mState, pod *mPod) { pod.kubelet, pod.restarts = kBackOff, pod.restarts+1 }, "kubelet backs off p%d's restart"),
		move(func(_ mState, pod *mPod) bool {
			return (pod.kubelet == kExited || pod.kubelet == kBackOff) && !pod.seen
		},
			func(_ *mState, pod *mPod) { pod.kubelet = kRunning }, "kubelet restarts p%d's container in place"),
		move(func(_ mState, pod *mPod) bool { return pod.kubelet == kRunning && !pod.seen },
			func(_ *mState, pod *mPod) { pod.kubelet = kDone }, "p%d completes"),
		move(func(_ mState, pod *mPod) bool { return pod.deleting && !pod.seen },
			func(_ *mState, pod *mPod) { pod.seen = true }, "kubelet sees p%d's deletion"),
		move(func(_ mState, pod *mPod) bool { return pod.seen && pod.kubelet != kNotStarted },
			func(_ *mState, pod *mPod) { pod.kubelet, pod.gone = kDone, true }, "kubelet stops p%d for its deletion; the object goes"),
	}
}

// runs is the oracle of "the pod runs": its kubelet started it and has not
// stopped it for good (a container waiting to be restarted in place runs
// again, unless the kubelet has seen the pod's deletion).
func runs(pod mPod) bool {
	return !pod.gone && (pod.kubelet == kRunning || ((pod.kubelet == kExited || pod.kubelet == kBackOff) && !pod.seen))
}

// oracle checks the invariants that hold between steps.
func oracle(s mState) string {
	var running []string
	for p, pod := range s.api.pods {
		if runs(pod) {
			running = append(running, fmt.Sprintf("p%d", p))
		}
	}
	if len(running) > 1 {
		return "two guarded pods of the key run at once: " + strings.Join(running, ", ")
	}
	return ""
}

// replicaStep is replica r's next read or write.
func replicaStep(s mState, r int) (mState, string, string) {
	rep := &s.reps[r]
	name := fmt.Sprintf("r%d", r)
	switch rep.pc {
	case pcIdle:
		return read(s, r)
	case pcRelease:
		// Force release of the ownership of the holder it saw stopped.
		if s.redis.holder == rep.target {
			if runs(s.api.pods[rep.target]) {
				return s, name + " releases the key", fmt.Sprintf("%s released the key while its holder p%d runs", name, rep.target)
			}
			s.redis.holder, s.redis.count, s.redis.token = none, 0, 0
		}
		if rep.memory == rep.target {
			rep.memory = none
		}
		rep.pc = pcClear
		return s, fmt.Sprintf("%s releases the key of stopped p%d", name, rep.target), ""
	case pcTake:
		switch s.redis.holder {
		case none:
			s.redis.counter++
			s.redis.holder, s.redis.count, s.redis.token = rep.target, 1, s.redis.counter
		case rep.target:
			s.redis.count++
		default:
			rep.pc = pcIdle
			return s, fmt.Sprintf("%s cannot take the key for p%d: it is held", name, rep.target), ""
		}
		rep.token, rep.took, rep.memory = s.redis.token, true, rep.target
		rep.pc = pcRecordA
		if rep.lift {
			rep.pc = pcCheck
		}
		return s, fmt.Sprintf("%s takes the key for p%d (token %d)", name, rep.target, rep.token), ""
	case pcCheck:
		// confirmNoOtherGrant: the locks past the cache.
		for l, lk := range s.api.locks {
			if !rep.view.locks[l].exists || !lk.exists {
				continue // only the locks this reconcile read are read again
			}
			if lk.highest > rep.token {
				return giveBack(s, r, fmt.Sprintf("%s finds token %d recorded on %s, above its %d", name, lk.highest, lockNm[l], rep.token))
			}
			if g := lk.grant; g.pod != none && g.pod != rep.target {
				// The pod is read from the cache if the cache has it, else
				// from the API server (podPastCache).
				other := rep.cache.pods[g.pod]
				if other.gone {
					other = s.api.pods[g.pod]
				}
				if !other.gone && !Stopped(podObject(other, int(g.pod))) {
					return giveBack(s, r, fmt.Sprintf("%s finds p%d's grant recorded on %s past its cache", name, g.pod, lockNm[l]))
				}
			}
		}
		rep.pc = pcRecordA
		return s, name + " checks past its cache: no other grant", ""
	case pcRecordA, pcRecordB:
		l := int(rep.pc - pcRecordA)
		rep.pc++
		if l == 1 {
			rep.pc = pcLift
		}
		view := &rep.view.locks[l]
		if !view.exists {
			return s, fmt.Sprintf("%s does not know lock %s", name, lockNm[l]), ""
		}
		if l == 1 && rep.unshared {
			// A lock of a namespace that may not use the key learns nothing of it.
			return s, fmt.Sprintf("%s records nothing on refused lock %s", name, lockNm[l]), ""
		}
		want := *view
		want.highest = max(want.highest, rep.token)
		if rep.target != none && podNS[rep.target] == lockNS[l] {
			if g := view.grant; g.pod == none || g.pod == rep.target {
				want.grant = mGrant{pod: rep.target, token: max(g.token, rep.token), lifted: g.lifted || rep.lift}
			}
		}
		if want == *view {
			return s, fmt.Sprintf("%s has nothing to record on %s", name, lockNm[l]), ""
		}
		if s.api.locks[l].rv != view.rv {
			// A pod whose gate is lifted already, past the cache, holds a
			// recorded grant: its take is kept, as a re-take's is.
			if rep.lift && s.api.pods[rep.target].gate {
				return giveBack(s, r, fmt.Sprintf("%s's record on %s is refused (resourceVersion)", name, lockNm[l]))
			}
			rep.pc = pcIdle
			return s, fmt.Sprintf("%s's record on %s is refused (resourceVersion); it keeps its hold", name, lockNm[l]), ""
		}
		if want.highest < s.api.locks[l].highest {
			rep.pc = pcIdle
			return s, fmt.Sprintf("%s's record on %s is refused (highestToken)", name, lockNm[l]), ""
		}
		want.rv++
		s.api.locks[l], *view = want, want
		if want.grant.pod == rep.target {
			return s, fmt.Sprintf("%s records p%d's grant (token %d) on %s", name, rep.target, rep.token, lockNm[l]), ""
		}
		return s, fmt.Sprintf("%s records token %d on %s", name, rep.token, lockNm[l]), ""
	case pcLift:
		rep.pc = pcClear
		if rep.target == none || !rep.lift {
			return s, name + " lifts nothing", ""
		}
		p := int(rep.target)
		l := podLock[p]
		lockObj := lockObject(rep.view.locks[l], int(l))
		podObj := podObject(rep.view.pods[p], p)
		if !RecordsLift(lockObj, podObj) {
			return s, fmt.Sprintf("%s lifts nothing: %s does not record p%d's lift", name, lockNm[l], p), ""
		}
		api := &s.api.pods[p]
		if api.rv != rep.view.pods[p].rv || api.gone {
			return s, fmt.Sprintf("%s's lift from p%d is refused (resourceVersion)", name, p), ""
		}
		if rep.token < s.api.locks[l].highest {
			return s, fmt.Sprintf("%s's lift from p%d is refused by the fencing policy", name, p), ""
		}
		if g := s.api.locks[l].grant; g.pod != int8(p) || !g.lifted {
			return s, fmt.Sprintf("%s lifts p%d's gate", name, p), fmt.Sprintf("%s lifted p%d's gate, but %s's record names p%d", name, p, lockNm[l], g.pod)
		}
		api.gate, api.rv = false, api.rv+1
		return s, fmt.Sprintf("%s lifts p%d's gate (token %d)", name, p, rep.token), ""
	case pcClear:
		rep.pc = pcIdle
		// forgetEndedGrants: a record whose pod it sees stopped or gone.
		for l := range rep.view.locks {
			g := rep.view.locks[l].grant
			if g.pod == none {
				continue
			}
			if pod := rep.view.pods[g.pod]; !pod.gone && !Stopped(podObject(pod, int(g.pod))) {
				continue
			}
			if s.api.locks[l].rv != rep.view.locks[l].rv {
				return s, fmt.Sprintf("%s's clear of %s's record is refused (resourceVersion)", name, lockNm[l]), ""
			}
			s.api.locks[l].grant = mGrant{pod: none}
			s.api.locks[l].rv++
			return s, fmt.Sprintf("%s clears %s's record of stopped p%d", name, lockNm[l], g.pod), ""
		}
		return s, name + " is done", ""
	}
	return s, "", ""
}

// giveBack undoes this reconcile's level of the hold, by its token.
func giveBack(s mState, r int, why string) (mState, string, string) {
	rep := &s.reps[r]
	rep.pc = pcIdle
	if rep.took && s.redis.holder == rep.target && s.redis.token == rep.token {
		if s.redis.count--; s.redis.count == 0 {
			if runs(s.api.pods[rep.target]) {
				return s, why + "; it gives the hold back", fmt.Sprintf("r%d gave the key back while its holder p%d runs", r, rep.target)
			}
			s.redis.holder, s.redis.token = none, 0
		}
	}
	if rep.memory == rep.target {
		rep.memory = none
	}
	return s, why + "; it gives its take back", ""
}

// read is a replica's read of its cache and of Redis, and its decision.
func read(s mState, r int) (mState, string, string) {
	rep := &s.reps[r]
	rep.view, rep.took, rep.lift, rep.target, rep.token = rep.cache, false, false, none, 0
	v := viewOf(rep.view, s.redis, rep.memory, !rep.unshared)
	name := fmt.Sprintf("r%d", r)
	if h := s.redis.holder; h != none && h != outsider {
		if pod := rep.view.pods[h]; pod.gone || Stopped(podObject(pod, int(h))) {
			rep.target, rep.pc = h, pcRelease
			return s, fmt.Sprintf("%s reads: holder p%d has stopped", name, h), ""
		}
	}
	res := v.Resolve()
	switch g := res.Grantee; {
	case g != nil && res.Held:
		rep.target, rep.token = podIndex(g), s.redis.token
		rep.lift = v.Lifting(g)
		// adopt: re-enter the ownership Redis shows, unless this process
		// renews it already.
		if rep.memory != rep.target {
			s.redis.count++
			rep.took, rep.memory = true, rep.target
		}
		rep.pc = pcRecordA
		if rep.lift {
			rep.pc = pcCheck
		}
		return s, fmt.Sprintf("%s reads: p%d holds the key (%s); it adopts the hold", name, rep.target, res.Source), ""
	case g != nil && res.Retake:
		rep.target = podIndex(g)
		rep.lift = slices.ContainsFunc(v.LocksIn(g.Namespace), func(l *locksv1.DistributedLock) bool {
			return HasGate(g, locksv1.GateFor(l.Name))
		})
		rep.pc = pcTake
		return s, fmt.Sprintf("%s reads: p%d's grant (%s) lost its hold; it takes the key again", name, rep.target, res.Source), ""
	case g != nil:
		rep.pc = pcClear
		return s, fmt.Sprintf("%s reads: p%d's grant is in conflict", name, podIndex(g)), ""
	case s.redis.holder != none:
		rep.pc = pcClear
		return s, fmt.Sprintf("%s reads: the key is held, no grant", name), ""
	}
	for _, c := range v.Candidates {
		p := podIndex(c)
		pod := rep.view.pods[p]
		if pod.deleting || Stopped(c) {
			continue
		}
		rep.target, rep.pc, rep.lift = p, pcTake, pod.gate
		return s, fmt.Sprintf("%s reads: the key is free; it grants p%d", name, p), ""
	}
	rep.pc = pcClear
	return s, name + " reads: nothing to grant", ""
}

func podIndex(p *corev1.Pod) int8 { return int8(p.Name[1] - '0') }

// viewOf is the decide.View of what a replica read; sharesB says whether
// its flags share the key with namespace b.
func viewOf(api mAPI, redis mRedis, memory int8, sharesB bool) *View {
	v := &View{Key: "k", MayUse: map[string]bool{"a": true, "b": sharesB}, ByUID: map[types.UID]*corev1.Pod{},
		Selects: func(l *locksv1.DistributedLock, p *corev1.Pod) bool {
			return p.Labels[locksv1.LockLabel] == l.Name && !(api.deselected && l.Name == "A" && p.Name == "p1")
		}}
	for l := range api.locks {
		switch {
		case !api.locks[l].exists:
		case v.MayUse[lockNS[l]]:
			v.Locks = append(v.Locks, lockObject(api.locks[l], l))
		default:
			v.Revoked = append(v.Revoked, lockObject(api.locks[l], l))
		}
	}
	// The scope holds the pods of the namespaces of the locks it read; the
	// candidates are those a live lock selects.
	for p := range api.pods {
		if api.pods[p].gone || !api.locks[podLock[p]].exists {
			continue
		}
		obj := podObject(api.pods[p], p)
		v.ByUID[obj.UID] = obj
		if len(v.SelectorsOf(obj)) > 0 {
			v.Candidates = append(v.Candidates, obj)
		}
	}
	if memory != none {
		v.Memory = types.UID(fmt.Sprintf("p%d", memory))
	}
	if h := redis.holder; h != none {
		owner := fmt.Sprintf("p%d:0", h)
		if h == outsider {
			owner = "outsider:1"
		}
		uid := types.UID(owner[:strings.IndexByte(owner, ':')])
		v.Holders = []Holder{{Owner: owner, PodUID: uid, Pod: v.ByUID[uid]}}
	}
	return v
}

func lockObject(l mLock, i int) *locksv1.DistributedLock {
	obj := &locksv1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Namespace: lockNS[i], Name: lockNm[i]}, Spec: locksv1.DistributedLockSpec{Key: "k"}}
	obj.Status.HighestToken = int64(l.highest)
	if l.grant.pod != none {
		uid := fmt.Sprintf("p%d", l.grant.pod)
		obj.Status.Grant = &locksv1.LockGrant{PodName: uid, PodUID: uid, Token: int64(l.grant.token), GateLifted: l.grant.lifted}
	}
	return obj
}

// podObject is the pod as its kubelet reports it: a container that exited
// to be restarted in place shows Terminated, then Waiting (CrashLoopBackOff)
// with its last termination, the phase staying Running.
func podObject(pod mPod, i int) *corev1.Pod {
	at := metav1.NewTime(time.Unix(1000, 0))
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNS[i], Name: fmt.Sprintf("p%d", i), UID: types.UID(fmt.Sprintf("p%d", i)),
			Labels: map[string]string{locksv1.LockLabel: lockNm[podLock[i]]}, Generation: 1},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, ObservedGeneration: 1},
	}
	if pod.gate {
		obj.Spec.SchedulingGates = append(obj.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1.GateFor(lockNm[podLock[i]])})
	}
	if pod.gateX {
		obj.Spec.SchedulingGates = append(obj.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: locksv1.GateFor("X")})
	}
	if pod.deleting {
		obj.DeletionTimestamp, obj.Generation = &at, 2
	}
	if pod.seen {
		obj.Status.ObservedGeneration = 2
	}
	if !pod.gate && !pod.gateX {
		obj.Spec.NodeName = "node"
	}
	cs := corev1.ContainerStatus{Name: "app", RestartCount: int32(pod.restarts)}
	switch pod.kubelet {
	case kRunning:
		obj.Status.Phase = corev1.PodRunning
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: at}
	case kExited:
		obj.Status.Phase = corev1.PodRunning
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, StartedAt: at, FinishedAt: at}
	case kBackOff:
		obj.Status.Phase = corev1.PodRunning
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, StartedAt: at, FinishedAt: at}
	case kDone:
		obj.Status.Phase = corev1.PodSucceeded
		cs.State.Terminated = &corev1.ContainerStateTerminated{StartedAt: at, FinishedAt: at}
	}
	if pod.kubelet != kNotStarted {
		obj.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	}
	return obj
}
