package plane

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Stamp is one line of a pod's RunsAnnotation: a container started or
// stopped.
type Stamp struct {
	At        time.Time
	Start     bool // false: the container stopped
	Container string
	ExitCode  int // of a stop
}

// Stamps parses the pod's RunsAnnotation, in the order kwok wrote it; none
// if the pod has no stamps.
func Stamps(pod *corev1.Pod) ([]Stamp, error) {
	var out []Stamp
	for i, line := range strings.Split(pod.Annotations[RunsAnnotation], "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		bad := func(why string) error {
			return fmt.Errorf("pod %s/%s: %s line %d %q: %s", pod.Namespace, pod.Name, RunsAnnotation, i+1, line, why)
		}
		if len(f) < 3 {
			return nil, bad("too few fields")
		}
		at, err := time.Parse(time.RFC3339Nano, f[0])
		if err != nil {
			return nil, bad(err.Error())
		}
		s := Stamp{At: at, Container: f[2]}
		switch {
		case f[1] == "start" && len(f) == 3:
			s.Start = true
		case f[1] == "stop" && len(f) == 4:
			if s.ExitCode, err = strconv.Atoi(f[3]); err != nil {
				return nil, bad(err.Error())
			}
		default:
			return nil, bad("want <time> start <container> or <time> stop <container> <exit code>")
		}
		out = append(out, s)
	}
	return out, nil
}

// Run is one run of one container, from its start stamp to the stop stamp
// that follows; End is zero while no stop follows (it runs, or kwok never
// played its end).
type Run struct {
	Container  string
	Start, End time.Time
	ExitCode   int
}

// Runs pairs the pod's stamps into the runs of its containers, ordered by
// start. It refuses a log no kubelet could have written: a container that
// stops without running, starts again while it runs, or stops before it
// started.
func Runs(pod *corev1.Pod) ([]Run, error) {
	stamps, err := Stamps(pod)
	if err != nil {
		return nil, err
	}
	var runs []Run
	open := map[string]int{} // container -> index in runs of its open run
	for _, s := range stamps {
		i, running := open[s.Container]
		switch {
		case s.Start && running:
			return nil, fmt.Errorf("pod %s/%s: container %s started at %s while it ran", pod.Namespace, pod.Name, s.Container, s.At.Format(time.RFC3339Nano))
		case s.Start:
			open[s.Container] = len(runs)
			runs = append(runs, Run{Container: s.Container, Start: s.At})
		case !running:
			return nil, fmt.Errorf("pod %s/%s: container %s stopped at %s without running", pod.Namespace, pod.Name, s.Container, s.At.Format(time.RFC3339Nano))
		case s.At.Before(runs[i].Start):
			return nil, fmt.Errorf("pod %s/%s: container %s stopped at %s, before it started", pod.Namespace, pod.Name, s.Container, s.At.Format(time.RFC3339Nano))
		default:
			runs[i].End, runs[i].ExitCode = s.At, s.ExitCode
			delete(open, s.Container)
		}
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Start.Before(runs[j].Start) })
	return runs, nil
}

// Interval is a span of time; End is zero if it has not ended.
type Interval struct{ Start, End time.Time }

// Busy merges runs into the intervals during which at least one of them
// ran: a pod runs while any of its containers runs. A run with no end makes
// the last interval open.
func Busy(runs []Run) []Interval {
	sorted := append([]Run(nil), runs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start.Before(sorted[j].Start) })
	var out []Interval
	for _, r := range sorted {
		if n := len(out); n > 0 && (out[n-1].End.IsZero() || !r.Start.After(out[n-1].End)) {
			if !out[n-1].End.IsZero() && (r.End.IsZero() || r.End.After(out[n-1].End)) {
				out[n-1].End = r.End
			}
			continue
		}
		out = append(out, Interval{Start: r.Start, End: r.End})
	}
	return out
}
