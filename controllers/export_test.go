package controllers

import "k8s.io/apimachinery/pkg/types"

// SelectorCached reports whether the lock's parsed selector is cached, for
// the tests of package controllers_test.
func SelectorCached(lock types.NamespacedName) bool {
	_, ok := selectors.m.Load(lock)
	return ok
}
