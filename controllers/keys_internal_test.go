package controllers

import "testing"

func TestKeyPolicy(t *testing.T) {
	var p KeyPolicy
	for _, flag := range []string{"billing=team-a,team-b", "audit=*"} {
		if err := p.Share(flag); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"billing", "=team-a", "billing="} {
		if err := p.Share(bad); err == nil {
			t.Errorf("Share(%q) = nil, want an error", bad)
		}
	}
	cases := []struct {
		namespace, key string
		want           bool
	}{
		{"team-a", "team-a/leader", true},   // its own
		{"team-a", "team-b/leader", false},  // another namespace's
		{"team-a", "team-ab/leader", false}, // a prefix is not a namespace
		{"team-a", "billing", true},         // shared with it
		{"team-c", "billing", false},        // shared, but not with it
		{"team-c", "audit", true},           // shared with every namespace
		{"team-c", "payments", false},       // shared with nobody
	}
	for _, c := range cases {
		if got := p.Permits(c.namespace, c.key); got != c.want {
			t.Errorf("Permits(%q, %q) = %v, want %v", c.namespace, c.key, got, c.want)
		}
	}
}
