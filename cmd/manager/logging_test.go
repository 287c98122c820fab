package main

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Every line the manager writes is one JSON object, its libraries' lines
// included: client-go's klog (leader election) and go-redis's (a Sentinel
// that does not answer), which print plain text unless routed. The test
// runs the binary as a pod runs it, with its whole output as the pod log.
func TestEveryLogLineIsJSON(t *testing.T) {
	cfg, c := apiServer(t)
	ns := newNamespace(t, c, "logging-")
	cmd := exec.Command(managerBin, "--kubeconfig="+writeKubeconfig(t, cfg, &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}),
		"--leader-elect", "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=1s",
		"--metrics-bind-address="+freeAddr(t), "--health-probe-bind-address="+freeAddr(t),
		"--redis-sentinel-addrs="+freeAddr(t), "--redis-sentinel-master=absent")
	cmd.Env = []string{"HOME=" + t.TempDir(), "POD_NAMESPACE=" + ns}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout // one stream, as the pod log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// Seen from each library, by the logger name routeLogs gives it.
	want := map[string]string{"klog": "successfully acquired lease", "go-redis": "sentinel: getmasteraddrbyname"}
	var all []string
	timeout := time.After(60 * time.Second)
	for len(want) > 0 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the manager exited; still waiting for %v:\n%s", want, strings.Join(all, "\n"))
			}
			all = append(all, line)
			var entry map[string]any
			if err := json.Unmarshal([]byte(line), &entry); err != nil {
				t.Fatalf("a log line is not JSON: %q\n%s", line, strings.Join(all, "\n"))
			}
			for logger, text := range want {
				if entry["logger"] == logger && strings.Contains(strings.ToLower(entry["msg"].(string)), text) {
					delete(want, logger)
				}
			}
		case <-timeout:
			t.Fatalf("no line of %v within 60s:\n%s", want, strings.Join(all, "\n"))
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	for line := range lines {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("a log line while stopping is not JSON: %q", line)
		}
	}
}
