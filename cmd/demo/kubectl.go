package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"
)

// kubectl runs the real kubectl binary, printing the commands the story
// shows and their output.
type kubectl struct {
	out io.Writer
	bin string
	dir string
	env []string
}

func (k *kubectl) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, k.bin, args...)
	cmd.Dir = k.dir
	cmd.Env = k.env
	cmd.SysProcAttr = childAttrs()
	return cmd
}

// run prints "$ kubectl <args>", runs it and prints its output.
func (k *kubectl) run(ctx context.Context, args ...string) (string, error) {
	fmt.Fprintf(k.out, "$ kubectl %s\n", shellJoin(args))
	return k.exec(ctx, nil, args...)
}

// apply prints and applies a manifest from standard input.
func (k *kubectl) apply(ctx context.Context, manifest string) (string, error) {
	manifest = strings.TrimLeft(manifest, "\n")
	fmt.Fprintf(k.out, "$ kubectl apply -f - <<EOF\n%sEOF\n", manifest)
	return k.exec(ctx, strings.NewReader(manifest), "apply", "-f", "-")
}

func (k *kubectl) exec(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := k.command(ctx, args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := out.String()
	fmt.Fprint(k.out, text)
	if text != "" && !strings.HasSuffix(text, "\n") {
		fmt.Fprintln(k.out)
	}
	if err != nil {
		if ctx.Err() != nil {
			return text, ctx.Err()
		}
		return text, fmt.Errorf("kubectl %s: %w", shellJoin(args), err)
	}
	return text, nil
}

// quiet runs kubectl without printing anything, for the demo's checks.
func (k *kubectl) quiet(ctx context.Context, args ...string) (string, error) {
	cmd := k.command(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", fmt.Errorf("kubectl %s: %w: %s", shellJoin(args), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// getJSON reads one object with kubectl get -o json into v.
func (k *kubectl) getJSON(ctx context.Context, v any, args ...string) error {
	out, err := k.quiet(ctx, append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

// watchLine is one line a watching kubectl printed, and when it arrived.
type watchLine struct {
	text string
	at   time.Time
}

// watcher is a running `kubectl get --watch`.
type watcher struct {
	cmd   *exec.Cmd
	lines chan watchLine
	stop  chan struct{}
	read  sync.WaitGroup
	once  sync.Once
}

// watch starts kubectl with the arguments, which should include --watch,
// without printing anything.
func (k *kubectl) watch(ctx context.Context, args ...string) (*watcher, error) {
	w := &watcher{cmd: k.command(ctx, args...), lines: make(chan watchLine), stop: make(chan struct{})}
	stdout, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	w.read.Add(1)
	go func() {
		defer w.read.Done()
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case w.lines <- watchLine{text: sc.Text(), at: time.Now()}:
			case <-w.stop:
				return
			}
		}
	}()
	return w, nil
}

// next waits for a line that satisfies ok, up to timeout, and returns it
// with the lines before it.
func (w *watcher) next(ctx context.Context, timeout time.Duration, ok func(string) bool) (watchLine, []watchLine, error) {
	var seen []watchLine
	deadline := time.After(timeout)
	for {
		select {
		case l, open := <-w.lines:
			if !open {
				return watchLine{}, seen, fmt.Errorf("kubectl %s ended", shellJoin(w.cmd.Args[1:]))
			}
			seen = append(seen, l)
			if ok(l.text) {
				return l, seen, nil
			}
		case <-deadline:
			return watchLine{}, seen, fmt.Errorf("timed out after %v", timeout)
		case <-ctx.Done():
			return watchLine{}, seen, ctx.Err()
		}
	}
}

// close stops kubectl and waits for it.
func (w *watcher) close() {
	w.once.Do(func() {
		close(w.stop)
		_ = w.cmd.Process.Kill()
		w.read.Wait()
		_ = w.cmd.Wait()
	})
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./:=,@%+-]+$`)

// shellQuote quotes s for a POSIX shell, if it needs quoting.
func shellQuote(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	return strings.Join(quoted, " ")
}
