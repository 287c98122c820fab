package plane_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/plane"
)

func stamped(lines ...string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{
		plane.RunsAnnotation: strings.Join(lines, "\n") + "\n",
	}}}
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, "2026-01-01T00:00:"+s+"Z")
	if err != nil {
		panic(err)
	}
	return t
}

// Runs pairs each container's starts and stops, restarts included, and
// Busy merges them into the spans in which the pod ran.
func TestRunsAndBusy(t *testing.T) {
	pod := stamped(
		"2026-01-01T00:00:01Z start setup",
		"2026-01-01T00:00:02Z stop setup 0",
		"2026-01-01T00:00:02.5Z start proxy",
		"2026-01-01T00:00:03Z start work",
		"2026-01-01T00:00:04Z stop work 1",
		"2026-01-01T00:00:05Z stop proxy 143",
		"2026-01-01T00:00:07Z start work",
	)
	runs, err := plane.Runs(pod)
	if err != nil {
		t.Fatal(err)
	}
	want := []plane.Run{
		{Container: "setup", Start: at("01"), End: at("02"), ExitCode: 0},
		{Container: "proxy", Start: at("02.5"), End: at("05"), ExitCode: 143},
		{Container: "work", Start: at("03"), End: at("04"), ExitCode: 1},
		{Container: "work", Start: at("07")},
	}
	if len(runs) != len(want) {
		t.Fatalf("runs %+v, want %+v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Errorf("run %d: %+v, want %+v", i, runs[i], want[i])
		}
	}
	busy := plane.Busy(runs)
	wantBusy := []plane.Interval{{Start: at("01"), End: at("02")}, {Start: at("02.5"), End: at("05")}, {Start: at("07")}}
	if len(busy) != len(wantBusy) {
		t.Fatalf("busy %+v, want %+v", busy, wantBusy)
	}
	for i := range wantBusy {
		if busy[i] != wantBusy[i] {
			t.Errorf("busy %d: %+v, want %+v", i, busy[i], wantBusy[i])
		}
	}
	if b := plane.Busy([]plane.Run{{Start: at("01")}, {Start: at("02"), End: at("03")}}); len(b) != 1 || !b[0].End.IsZero() {
		t.Errorf("a run with no end keeps the pod running: %+v", b)
	}
}

// A log no kubelet could write is refused, not read as something else.
func TestRunsRefusesImpossibleLogs(t *testing.T) {
	for name, lines := range map[string][]string{
		"stop without start":  {"2026-01-01T00:00:01Z stop work 0"},
		"start while running": {"2026-01-01T00:00:01Z start work", "2026-01-01T00:00:02Z start work"},
		"stop before start":   {"2026-01-01T00:00:02Z start work", "2026-01-01T00:00:01Z stop work 0"},
		"bad time":            {"yesterday start work"},
		"no exit code":        {"2026-01-01T00:00:01Z start work", "2026-01-01T00:00:02Z stop work"},
		"unknown event":       {"2026-01-01T00:00:01Z pause work"},
	} {
		if _, err := plane.Runs(stamped(lines...)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
