package plane

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// setprivPath is util-linux's setpriv, which sets the parent-death signal
// and then execs a program.
const setprivPath = "/usr/bin/setpriv"

// wrapDeathSignal returns a script that runs the asset name through
// setpriv, so that it dies with the plane's process: envtest starts etcd
// and kube-apiserver with attributes of its own, without a parent-death
// signal. Without setpriv it returns the binary itself; a graceful Stop
// still stops it.
func (p *Plane) wrapDeathSignal(name string) (string, error) {
	bin := filepath.Join(p.AssetsDir, name)
	if _, err := os.Stat(setprivPath); err != nil {
		return bin, nil
	}
	path := filepath.Join(p.Dir, "bin", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %s --pdeathsig KILL -- '%s' \"$@\"\n", setprivPath, strings.ReplaceAll(bin, "'", `'\''`))
	return path, os.WriteFile(path, []byte(script), 0o755)
}

// childPID is the process ID of this process's child named comm (the
// wrapper execs into the binary, so it keeps the child's ID), or 0.
func childPID(comm string) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces, so split at
		// the last ')'.
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || s[open+1:end] != comm {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == self {
			return pid
		}
	}
	return 0
}

// RSS is the resident set size of process pid, from /proc; 0 if unknown.
func RSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "<n> kB"
			if len(f) == 2 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}
