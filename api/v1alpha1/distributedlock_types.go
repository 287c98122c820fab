package v1alpha1

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The marks and gates of a lock on a pod. Each is a prefix followed by the
// lock's name: a pod may be a candidate of several locks, and each lock has
// marks of its own, so one lock never overwrites another's and a Service can
// select the holder of each lock. Lock names are at most 63 characters, so
// every one of these is a valid label, annotation or gate name.
const (
	// GatePrefix + <lock name> is the scheduling gate by which a pod waits
	// for the DistributedLock of that name in its namespace. A pod with
	// several such gates starts only once it holds every one of those locks.
	GatePrefix = "gate.lockwarden.dev/"
	// HolderLabelPrefix + <lock name> is set to "true" on the pod holding
	// the lock, so a Service can select it.
	HolderLabelPrefix = "holder.lockwarden.dev/"
	// OwnerAnnotationPrefix + <lock name> is the holder's owner ID in Redis:
	// "<pod UID>:0" when the controller holds the lock for the pod (a grant,
	// kept until the pod stops), another suffix for the pod's own client.
	OwnerAnnotationPrefix = "owner.lockwarden.dev/"
	// TokenAnnotationPrefix + <lock name> is the fencing token of the
	// holder's ownership.
	TokenAnnotationPrefix = "token.lockwarden.dev/"
	// SinceAnnotationPrefix + <lock name> is when the pod was marked as the
	// holder of that ownership, in RFC 3339.
	SinceAnnotationPrefix = "since.lockwarden.dev/"
	// Finalizer releases the lock in Redis before the resource goes away.
	Finalizer = "locks.lockwarden.dev/release"
)

// MarkAnnotationPrefixes are the prefixes of the annotations a lock's marks
// consist of, beside the holder label.
var MarkAnnotationPrefixes = []string{OwnerAnnotationPrefix, TokenAnnotationPrefix, SinceAnnotationPrefix}

// The opt-in of a pod, which the admission policy config/admission/gate.yaml
// turns into the scheduling gates of the locks it names.
const (
	// LockLabel names the one lock a pod waits for, in its namespace.
	LockLabel = "lockwarden.dev/lock"
	// LocksAnnotation names, separated by commas, the locks a pod waits
	// for, in its namespace, when it needs several.
	LocksAnnotation = "lockwarden.dev/locks"
	// CandidateLabel is set to "true" on every pod the admission policy
	// gates, so that a manager watching only the pods with it
	// (--pod-label-selector) sees them.
	CandidateLabel = "lockwarden.dev/candidate"
)

// NamedLocks are the locks the pod names by LockLabel and LocksAnnotation,
// each once.
func NamedLocks(labels, annotations map[string]string) []string {
	var names []string
	add := func(name string) {
		if name = strings.TrimSpace(name); name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	for _, name := range strings.Split(annotations[LocksAnnotation], ",") {
		add(name)
	}
	add(labels[LockLabel])
	return names
}

// SplitGates splits a pod's scheduling gates into lockwarden's, by lock
// name, and other controllers'.
func SplitGates(gates []corev1.PodSchedulingGate) (locks, foreign []string) {
	for _, g := range gates {
		if name, ok := strings.CutPrefix(g.Name, GatePrefix); ok {
			locks = append(locks, name)
		} else {
			foreign = append(foreign, g.Name)
		}
	}
	return locks, foreign
}

// GateFor is the scheduling gate by which a pod waits for the lock.
func GateFor(lock string) string { return GatePrefix + lock }

// HolderLabelFor is the label that marks the holder of the lock.
func HolderLabelFor(lock string) string { return HolderLabelPrefix + lock }

// Condition types.
const (
	// ConditionReady is True when Redis is reachable and the spec is usable.
	ConditionReady = "Ready"
	// ConditionHeld is True while some owner holds the lock in Redis.
	ConditionHeld = "Held"
	// ConditionConflict is True while a pod the controller granted the
	// lock to has not stopped, but somebody else holds the key in Redis.
	// Nobody else is granted the lock until that pod stops.
	ConditionConflict = "Conflict"
	// ConditionHolderStarted is False while the holder pod, granted the lock
	// by the controller, has not started within spec.startTimeout. It is
	// only set while a pod of this namespace holds the lock.
	ConditionHolderStarted = "HolderStarted"
)

// DistributedLockSpec is the desired lock.
// +kubebuilder:validation:XValidation:rule="has(self.key) == has(oldSelf.key)",message="spec.key cannot be added or removed after creation; create a new DistributedLock instead"
// +kubebuilder:validation:XValidation:rule="!has(self.renewInterval) || duration(self.renewInterval) < (has(self.leaseDuration) ? duration(self.leaseDuration) : duration('30s'))",message="spec.renewInterval must be shorter than spec.leaseDuration, or the lease lapses between renewals"
type DistributedLockSpec struct {
	// Key is the lock's name in Redis. It defaults to "<namespace>/<name>".
	// A namespace may use the keys under its own name, "<namespace>/...";
	// any other key must be shared with it by the cluster administrator
	// (the manager's --shared-key flag), or the lock is not Ready. Every
	// lock naming the same key shares one holder and one waiting order. It
	// cannot be changed.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.key is immutable; create a new DistributedLock to use another key"
	// +kubebuilder:validation:XValidation:rule="!self.matches('[{}\\\\s]')",message="spec.key must not contain '{', '}' or whitespace"
	Key string `json:"key,omitempty"`

	// LeaseDuration is how long the lock outlives its last renewal, between
	// 1s and 1h. If the controller stops renewing (it crashed, or lost
	// Redis), the lock is freed after this long.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="spec.leaseDuration must be between 1s and 1h"
	LeaseDuration *metav1.Duration `json:"leaseDuration,omitempty"`

	// RenewInterval is how often the lease is renewed. Default: a third of
	// the lease. It must be at least 100ms and shorter than the lease. The
	// controller renews at most once a second, or, for a lease under 3s,
	// three times a lease: a shorter interval is raised to that.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms')",message="spec.renewInterval must be at least 100ms"
	RenewInterval *metav1.Duration `json:"renewInterval,omitempty"`

	// Candidates selects the pods, in the lock's namespace, that may hold
	// the lock. In mode Grant they are granted it one at a time, oldest pod
	// first; in mode Observe they take it themselves. Without it, the lock
	// selects the pods that name it: with the label lockwarden.dev/lock set
	// to its name, or in the annotation lockwarden.dev/locks.
	// +optional
	Candidates *PodSelector `json:"candidates,omitempty"`

	// Mode says who takes the lock. Grant (the default): the controller
	// takes it on behalf of one candidate at a time, and lifts the lock's
	// scheduling gate from a gated candidate once it holds the lock. Observe:
	// the candidates take it themselves, with an in-pod client such as
	// `lockwarden run --lock-resource`; the controller never takes it, and
	// only shows and marks the holder, lists the candidates queued for it,
	// and releases the hold of a candidate that has stopped. An Observe
	// lock never lifts a gate: gate no pod on it. It cannot be changed.
	// +optional
	// +kubebuilder:default=Grant
	// +kubebuilder:validation:Enum=Grant;Observe
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.mode is immutable; create a new DistributedLock to change who takes the lock"
	Mode LockMode `json:"mode,omitempty"`

	// StartTimeout bounds how long a pod granted the lock may take to start:
	// to be Running with every container running. A holder that has not
	// started by then (Unschedulable, ImagePullBackOff, a crash loop) is
	// reported by the HolderStarted condition and a Warning Event, and it
	// keeps the lock unless DeleteUnstarted is set. Between 1s and 24h.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="spec.startTimeout must be between 1s and 24h"
	StartTimeout *metav1.Duration `json:"startTimeout,omitempty"`

	// DeleteUnstarted, if true, has the controller evict a holder it
	// granted the lock to that has not started within StartTimeout; the
	// lock is released once the pod is gone, and granted to the next
	// candidate. The default, false, only reports such a holder: it keeps
	// the lock, since the controller cannot tell a slow start from a stuck
	// one.
	// +optional
	DeleteUnstarted bool `json:"deleteUnstarted,omitempty"`
}

// LockMode says who takes a DistributedLock: the controller, for its
// candidates (Grant), or the candidates themselves (Observe).
type LockMode string

const (
	// ModeGrant has the controller take the lock for one candidate at a
	// time.
	ModeGrant LockMode = "Grant"
	// ModeObserve has the candidates take the lock with their own clients;
	// the controller only watches, marks and cleans up after them.
	ModeObserve LockMode = "Observe"
)

// Observes reports whether the candidates take the lock themselves. A mode
// left empty (an object written before the field existed) is Grant.
func (s DistributedLockSpec) Observes() bool { return s.Mode == ModeObserve }

// PodSelector is a label selector for pods, as in a Deployment's
// spec.selector, with bounds so it can be checked at admission.
// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="spec.candidates must select pods with matchLabels or matchExpressions; an empty selector would make every pod in the namespace a candidate"
type PodSelector struct {
	// MatchLabels selects pods that carry all these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="spec.candidates.matchLabels keys must be valid label keys: an optional DNS-subdomain prefix and '/', then up to 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// MatchExpressions selects pods whose labels meet all these requirements.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	MatchExpressions []LabelRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is a label value: up to 63 alphanumerics, '-', '_' or '.',
// starting and ending with an alphanumeric.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
type LabelValue string

// LabelRequirement is one requirement of a PodSelector.
// +kubebuilder:validation:XValidation:rule="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",message="values must be non-empty for the operators In and NotIn, and empty for Exists and DoesNotExist"
type LabelRequirement struct {
	// Key is the label key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	Key string `json:"key"`
	// Operator is In, NotIn, Exists or DoesNotExist.
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`
	// Values for In and NotIn.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Values []LabelValue `json:"values,omitempty"`
}

// LabelSelector returns the selector in apimachinery's form.
func (s PodSelector) LabelSelector() *metav1.LabelSelector {
	sel := &metav1.LabelSelector{}
	for k, v := range s.MatchLabels {
		if sel.MatchLabels == nil {
			sel.MatchLabels = map[string]string{}
		}
		sel.MatchLabels[k] = string(v)
	}
	for _, r := range s.MatchExpressions {
		req := metav1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator}
		for _, v := range r.Values {
			req.Values = append(req.Values, string(v))
		}
		sel.MatchExpressions = append(sel.MatchExpressions, req)
	}
	return sel
}

// LockHolder is who holds the lock in Redis, as the controller last saw it.
type LockHolder struct {
	// PodName is the holder pod, when the owner ID maps to a pod.
	// +optional
	PodName string `json:"podName,omitempty"`
	// PodUID is the holder pod's UID, the first part of its owner ID.
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// OwnerID is the holder's ID in Redis, "<pod UID>:<n>". The controller
	// holds locks it grants as "<pod UID>:0"; an in-pod client uses other n.
	OwnerID string `json:"ownerID"`
	// GrantedByController is true when the controller holds the lock on
	// the pod's behalf, false for an in-pod client's own hold.
	GrantedByController bool `json:"grantedByController"`
	// Token is the fencing token of this ownership.
	Token int64 `json:"token"`
	// Since is when the controller first saw this ownership.
	Since metav1.Time `json:"since"`
}

// BlockedPod is a pod behind a lock's gate that cannot be granted the lock
// as things stand.
type BlockedPod struct {
	// PodName is the pod's name.
	PodName string `json:"podName"`
	// Reason says what holds it back.
	Reason string `json:"reason"`
}

// LockGrant is the controller's record of its grant of the key to a pod of
// the lock's namespace. It is written before any gate is lifted with the
// grant, replaced only by a later grant once this one is over, and cleared
// only once the API server shows the pod stopped or gone. Only the
// controller writes a lock's status, so this record, not the pod's marks
// (which its tenant can write), nor Redis (which can lose it, or show
// somebody else meanwhile), is what the controller trusts.
type LockGrant struct {
	// PodName is the pod granted the key.
	PodName string `json:"podName"`
	// PodUID is its UID.
	PodUID string `json:"podUID"`
	// Token is the fencing token of the grant's latest hold.
	Token int64 `json:"token"`
	// GateLifted is true once this lock lifted its gate from the pod. The
	// grant is then kept until the pod stops, even if the lock is deleted:
	// its finalizer waits for the pod.
	// +optional
	GateLifted bool `json:"gateLifted,omitempty"`
	// Since is when the grant was made.
	Since metav1.Time `json:"since"`
}

// DistributedLockStatus is the observed state of the lock.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.highestToken) || (has(self.highestToken) && self.highestToken >= oldSelf.highestToken)",message="status.highestToken never decreases: a lower one comes from a manager that lost its grant"
type DistributedLockStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Key is the lock's name in Redis, after defaulting.
	// +optional
	Key string `json:"key,omitempty"`
	// Holder is who holds the lock, when that is a pod in this namespace.
	// A holder elsewhere (another namespace sharing the key, another
	// cluster, a plain client) is not named: the Held condition says so.
	// +optional
	Holder *LockHolder `json:"holder,omitempty"`
	// Waiting are this namespace's candidate pods waiting for the lock, in
	// the order they will be granted it, which every lock naming the key
	// shares; the first 100 of them (WaitingCount counts them all). In mode
	// Observe: this namespace's pods whose clients are queued for the key in
	// Redis, head first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=100
	Waiting []string `json:"waiting,omitempty"`
	// Blocked are this namespace's pods behind this lock's gate that are not
	// in the waiting order, each with what holds it back: a gate of another
	// lock it takes first, another controller's gate, or a gate no lock can
	// lift (see the pod's Events); the first 100 by name.
	// +optional
	// +listType=map
	// +listMapKey=podName
	// +kubebuilder:validation:MaxItems=100
	Blocked []BlockedPod `json:"blocked,omitempty"`
	// WaitingCount is every pod waiting for the lock, Waiting and Blocked,
	// for kubectl's columns.
	// +optional
	WaitingCount int32 `json:"waitingCount,omitempty"`
	// Grant is the controller's record of its grant of the key to a pod of
	// this namespace, while that grant lasts.
	// +optional
	Grant *LockGrant `json:"grant,omitempty"`
	// HighestToken is the highest fencing token of the key's holders the
	// controller has seen, recorded on every lock naming the key before it
	// lifts any gate. It never decreases, and the admission policy in
	// config/admission refuses to lift this lock's gate from a pod with a
	// lower token: a manager that lost its grant (paused, or cut off, for
	// longer than the lease) cannot ungate a pod after another manager
	// granted the key again.
	// +optional
	HighestToken int64 `json:"highestToken,omitempty"`
	// Conditions are Ready, Held, Conflict and HolderStarted.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// DistributedLock is a named lock in Redis, granted to one candidate pod at a
// time.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dlock,categories=lockwarden
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.status.key`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.podName`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.holder.token`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.waitingCount`
// +kubebuilder:printcolumn:name="Conflict",type=string,JSONPath=`.status.conditions[?(@.type=="Conflict")].status`
// +kubebuilder:printcolumn:name="Lease",type=string,JSONPath=`.spec.leaseDuration`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is used as the value of the holder label"
type DistributedLock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is required: a lock without one would have no candidates.
	// +required
	Spec   DistributedLockSpec   `json:"spec"`
	Status DistributedLockStatus `json:"status,omitempty"`
}

// DistributedLockList is a list of DistributedLocks.
// +kubebuilder:object:root=true
type DistributedLockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DistributedLock `json:"items"`
}

func init() {
	SchemeBuilder.Register(&DistributedLock{}, &DistributedLockList{})
}
