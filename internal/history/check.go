package history

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Op returns the porcupine operation of a call: lane is its row in the
// visualisation. The times are copied into the input, where the model's
// rules that depend on time read them.
func Op(lane int, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: lane, Input: in, Output: out, Call: in.Call, Return: in.Return}
}

// Verdict is the outcome of checking one history.
type Verdict struct {
	Result porcupine.CheckResult
	Info   porcupine.LinearizationInfo
	Took   time.Duration
}

// Check checks a history against the model, for at most timeout (0: no
// bound): porcupine.Unknown if that ran out.
func Check(ops []porcupine.Operation, timeout time.Duration) Verdict {
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(Model.ToModel(), ops, timeout)
	return Verdict{Result: res, Info: info, Took: time.Since(start)}
}

// Visualize writes porcupine's HTML visualisation of a checked history.
func Visualize(v Verdict, path string) error {
	return porcupine.VisualizePath(Model.ToModel(), v.Info, path)
}

// Explain tells where an illegal history stops being explainable: the end
// of the longest order of its operations the model accepts, with the states
// it leaves, and the operations none of which can come next.
func Explain(ops []porcupine.Operation, v Verdict) string {
	var longest []porcupine.Operation
	for _, partition := range v.Info.PartialLinearizationsOperations() {
		for _, lin := range partition {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	done := make(map[Input]bool, len(longest))
	for _, op := range longest {
		done[op.Input.(Input)] = true
	}
	model := Model.ToModel()
	states := model.Init()
	var b strings.Builder
	fmt.Fprintf(&b, "the longest explainable order has %d of %d operations; its last ones, with the states they leave:\n", len(longest), len(ops))
	from := max(0, len(longest)-12)
	for i, op := range longest {
		_, states = model.Step(states, op.Input, op.Output)
		if i >= from {
			fmt.Fprintf(&b, "  %s\n      -> %s\n", line(op), model.DescribeState(states))
		}
	}
	// The operations not in it that could come next: those called before
	// the first of them returned. None of them can be explained.
	var rest []porcupine.Operation
	first := never
	for _, op := range ops {
		if !done[op.Input.(Input)] {
			rest = append(rest, op)
			first = min(first, op.Return)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].Call < rest[j].Call })
	b.WriteString("none of these can come next:\n")
	tokens := make(map[int64]bool)
	for _, op := range rest {
		if op.Call <= first {
			fmt.Fprintf(&b, "  %s\n", line(op))
			in, out := op.Input.(Input), op.Output.(Output)
			tokens[in.Token], tokens[out.Token] = true, true
		}
	}
	delete(tokens, 0)
	// And the whole story of their ownerships.
	var story []porcupine.Operation
	lo, hi := never, int64(0)
	for _, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if tokens[in.Token] || tokens[out.Token] {
			story = append(story, op)
			lo, hi = min(lo, op.Call), max(hi, op.Call)
		}
	}
	// And the faults struck meanwhile.
	for _, op := range ops {
		switch op.Input.(Input).Kind {
		case DataLoss, ForceRelease, Close, Failover:
			if op.Call <= hi && op.Return >= lo {
				story = append(story, op)
			}
		}
	}
	if len(story) > 0 {
		b.WriteString("every operation of their ownerships, and the faults struck meanwhile:\n")
		b.WriteString(Lines(story))
	}
	return b.String()
}

// Lines tells operations one a line, in order of their calls.
func Lines(ops []porcupine.Operation) string {
	sorted := append([]porcupine.Operation(nil), ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	var b strings.Builder
	for _, op := range sorted {
		fmt.Fprintf(&b, "  %s\n", line(op))
	}
	return b.String()
}

func line(op porcupine.Operation) string {
	return fmt.Sprintf("[%s, %s] %s", ms(op.Call), ms(op.Return), Describe(op.Input.(Input), op.Output.(Output)))
}

func ms(ns int64) string { return fmt.Sprintf("%.3fms", float64(ns)/1e6) }
