package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Annotations, labels and the scheduling gate the controller uses on pods.
const (
	// SchedulingGate keeps a guarded pod from being scheduled until it holds
	// the lock. Put it in spec.schedulingGates of the pod template.
	SchedulingGate = "lockwarden.dev/lock"
	// HolderLabel is set on the holder pod, with the lock's name as value, so
	// a Service can select the holder.
	HolderLabel = "lockwarden.dev/holder"
	// LockAnnotation names the lock the pod holds.
	LockAnnotation = "lockwarden.dev/lock"
	// TokenAnnotation is the fencing token of the pod's ownership.
	TokenAnnotation = "lockwarden.dev/fencing-token"
	// SinceAnnotation is when the pod was granted the lock, in RFC 3339.
	SinceAnnotation = "lockwarden.dev/held-since"
	// Finalizer releases the lock in Redis before the resource goes away.
	Finalizer = "locks.lockwarden.dev/release"
)

// Condition types.
const (
	// ConditionReady is True when Redis is reachable and the spec is usable.
	ConditionReady = "Ready"
	// ConditionHeld is True while some owner holds the lock in Redis.
	ConditionHeld = "Held"
)

// DistributedLockSpec is the desired lock.
// +kubebuilder:validation:XValidation:rule="has(self.key) == has(oldSelf.key)",message="spec.key cannot be added or removed after creation; create a new DistributedLock instead"
// +kubebuilder:validation:XValidation:rule="!has(self.renewInterval) || duration(self.renewInterval) < (has(self.leaseDuration) ? duration(self.leaseDuration) : duration('30s'))",message="spec.renewInterval must be shorter than spec.leaseDuration, or the lease lapses between renewals"
type DistributedLockSpec struct {
	// Key is the lock's name in Redis. It defaults to "<namespace>/<name>".
	// An explicit key may not contain "/", so it can never name another
	// namespace's default key; every lock that names the same explicit key,
	// in any namespace or cluster sharing the Redis, shares the lock. It
	// cannot be changed.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.key is immutable; create a new DistributedLock to use another key"
	// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="spec.key must not contain '/': keys of the form <namespace>/<name> are reserved for each namespace's default keys"
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
	// the lease. It must be at least 100ms and shorter than the lease.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms')",message="spec.renewInterval must be at least 100ms"
	RenewInterval *metav1.Duration `json:"renewInterval,omitempty"`

	// Candidates selects the pods, in the lock's namespace, that may hold
	// the lock. They are granted it one at a time, oldest pod first.
	Candidates PodSelector `json:"candidates"`
}

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

// LockHolder is who holds the lock.
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

// DistributedLockStatus is the observed state of the lock.
type DistributedLockStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Key is the lock's name in Redis, after defaulting.
	// +optional
	Key string `json:"key,omitempty"`
	// Holder is who holds the lock, if anyone.
	// +optional
	Holder *LockHolder `json:"holder,omitempty"`
	// Waiting are the candidate pods waiting for the lock, in the order
	// they will be granted it.
	// +optional
	// +listType=atomic
	Waiting []string `json:"waiting,omitempty"`
	// WaitingCount is len(Waiting), for kubectl's columns.
	// +optional
	WaitingCount int32 `json:"waitingCount,omitempty"`
	// Conditions are Ready and Held.
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
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.podName`
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.holder.token`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.waitingCount`
// +kubebuilder:printcolumn:name="Lease",type=string,JSONPath=`.spec.leaseDuration`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is used as the value of the holder label"
type DistributedLock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DistributedLockSpec   `json:"spec,omitempty"`
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
