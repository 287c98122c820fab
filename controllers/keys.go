package controllers

import (
	"fmt"
	"slices"
	"strings"
)

// KeyPolicy says which namespaces may use which keys. A namespace may always
// use the keys under its own name, "<namespace>/...", which includes every
// lock's default key. Any other key (one shared across namespaces, with
// another cluster, with `lockwarden run` or a Redisson application) must be
// shared with the namespace by the cluster administrator. The zero value
// shares nothing.
type KeyPolicy struct {
	// Shared maps a key to the namespaces that may use it; "*" is every
	// namespace.
	Shared map[string][]string
}

// Permits reports whether locks in the namespace may name the key.
func (p KeyPolicy) Permits(namespace, key string) bool {
	if strings.HasPrefix(key, namespace+"/") {
		return true
	}
	namespaces := p.Shared[key]
	return slices.Contains(namespaces, namespace) || slices.Contains(namespaces, "*")
}

// Share parses "KEY=NAMESPACE[,NAMESPACE...]" (the manager's --shared-key
// flag) and adds it to the policy.
func (p *KeyPolicy) Share(flag string) error {
	key, list, ok := strings.Cut(flag, "=")
	if !ok || key == "" || list == "" {
		return fmt.Errorf("--shared-key %q: want KEY=NAMESPACE[,NAMESPACE...], or KEY=* for every namespace", flag)
	}
	if p.Shared == nil {
		p.Shared = map[string][]string{}
	}
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			p.Shared[key] = append(p.Shared[key], ns)
		}
	}
	return nil
}
