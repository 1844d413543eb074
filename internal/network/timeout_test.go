package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// fakePluginScript is a CNI plugin whose behaviour per command is read from
// DIR/<plugin>.<COMMAND>: "fail" prints a CNI error, "hang" starts a child that keeps
// stdout open and waits for it (a plugin stuck on an iptables lock or a datastore),
// "leave" succeeds but leaves such a child behind, "slow" succeeds after half a second,
// "reserve-hang" creates an empty file DIR/ipam/fakenet/10.99.0.9 (a host-local
// reservation before its owner is written) and hangs; anything else succeeds. Every
// call is logged to DIR/calls, a "slow" one also when it is done.
const fakePluginScript = `#!/bin/sh
dir=%q
name=$(basename "$0")
echo "$name $CNI_COMMAND netns=$CNI_NETNS" >> "$dir/calls"
case "$(cat "$dir/$name.$CNI_COMMAND" 2>/dev/null)" in
fail) echo '{"cniVersion":"1.0.0","code":11,"msg":"injected failure"}'; exit 1 ;;
hang) echo $$ > "$dir/$name.pids"; sleep 1000 & echo $! >> "$dir/$name.pids"; wait; exit 1 ;;
leave) sleep 1000 & echo $! > "$dir/$name.pids" ;;
slow) sleep 0.5; echo "$name $CNI_COMMAND done" >> "$dir/calls" ;;
reserve-hang) mkdir -p "$dir/ipam/fakenet"; : > "$dir/ipam/fakenet/10.99.0.9"; sleep 1000 & wait; exit 1 ;;
esac
if [ "$CNI_COMMAND" = ADD ]; then
	echo '{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/fake"}],"ips":[{"address":"10.99.0.2/24","interface":0}]}'
fi
`

// fakeNet is a Manager over fake plugins: no root, no namespaces.
type fakeNet struct {
	t   *testing.T
	dir string // plugins, their control files and call log
	m   *Manager
}

func newFakeNet(t *testing.T, timeout time.Duration, plugins ...string) *fakeNet {
	t.Helper()
	dir := t.TempDir()
	f := &fakeNet{t: t, dir: dir}
	var confs []string
	for _, p := range plugins {
		if err := os.WriteFile(filepath.Join(dir, p), fmt.Appendf(nil, fakePluginScript, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		confs = append(confs, fmt.Sprintf(`{"type":%q}`, p))
	}
	confDir := filepath.Join(dir, "net.d")
	writeFiles(t, confDir, map[string]string{"10-fake.conflist": fmt.Sprintf(`{"cniVersion":"1.0.0","name":"fakenet","plugins":[%s]}`, strings.Join(confs, ","))})
	m, err := New(Config{
		ConfDir: confDir, BinDirs: []string{dir}, CacheDir: filepath.Join(dir, "cache"),
		Timeout: timeout, RetryInterval: 50 * time.Millisecond, CancelGrace: 200 * time.Millisecond,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	f.m = m
	return f
}

// set makes plugin answer cmd with mode ("fail", "hang", "" for success).
func (f *fakeNet) set(plugin, cmd, mode string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, plugin+"."+cmd), []byte(mode), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// calls returns the plugin calls so far, one "plugin COMMAND netns=PATH" each.
func (f *fakeNet) calls() []string {
	data, _ := os.ReadFile(filepath.Join(f.dir, "calls"))
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func (f *fakeNet) callCount(plugin, cmd string) int {
	data, _ := os.ReadFile(filepath.Join(f.dir, "calls"))
	return strings.Count(string(data), plugin+" "+cmd+" ")
}

// hungPids returns the pids a hanging plugin recorded: the plugin and its child.
func (f *fakeNet) hungPids(plugin string) []int {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, plugin+".pids"))
	if err != nil {
		f.t.Fatalf("hanging plugin %s recorded no pids: %v", plugin, err)
	}
	var pids []int
	for _, s := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(s); err == nil {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		f.t.Fatalf("pids of %s: %q", plugin, data)
	}
	return pids
}

// assertGone fails unless every pid is gone within a second: not running, and not
// a zombie of ours (one the plugin's exit orphaned is init's to reap).
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for _, pid := range pids {
		for {
			state, ppid, ok := procState(pid)
			if !ok || (state == "Z" && ppid != os.Getpid()) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("plugin process %d still there: state %s, parent %d", pid, state, ppid)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// procState returns a process's state letter and parent pid from /proc/PID/stat.
func procState(pid int) (string, int, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, _ := strconv.Atoi(fields[1])
	return fields[0], ppid, true
}

func fakePod() Pod {
	return Pod{ID: "pod-" + strconv.FormatInt(time.Now().UnixNano(), 36), NetNS: "/fake/netns", Name: "p", Namespace: "ns"}
}

// TestAddTimeoutKillsPlugin: a hanging ADD is killed with its child at the timeout,
// the error is a DeadlineExceeded naming network and plugin, and the DEL that undoes
// it still runs.
func TestAddTimeoutKillsPlugin(t *testing.T) {
	f := newFakeNet(t, 500*time.Millisecond, "crisp-ok", "crisp-hang")
	f.set("crisp-hang", "ADD", "hang")
	p := fakePod()
	start := time.Now()
	_, err := f.m.Setup(context.Background(), p)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Setup with a hanging plugin succeeded")
	}
	t.Logf("Setup failed after %v: %v", took, err)
	if took > 500*time.Millisecond+pluginWaitDelay {
		t.Errorf("Setup took %v with a 500ms timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error is not DeadlineExceeded: %v", err)
	}
	for _, w := range []string{`"fakenet"`, "crisp-hang", "ADD", "500ms", "cni.timeout_seconds", p.ID} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %q: %v", w, err)
		}
	}
	assertGone(t, f.hungPids("crisp-hang"))
	// Both plugins were asked to undo, the one that made something first.
	if f.callCount("crisp-ok", "DEL") != 1 || f.callCount("crisp-hang", "DEL") != 1 {
		t.Errorf("undo DELs: %v", f.calls())
	}
	if ids := f.m.Pending(); len(ids) != 0 {
		t.Errorf("pending DELs after a clean undo: %v", ids)
	}
}

// TestDelTimeoutRetriesOthersOnce: a DEL that hangs in one plugin takes one timeout,
// not one per pass; the plugins it kept from running are still called.
func TestDelTimeoutRetriesOthersOnce(t *testing.T) {
	f := newFakeNet(t, 500*time.Millisecond, "crisp-ok", "crisp-hang")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.set("crisp-hang", "DEL", "hang")
	start := time.Now()
	err := f.m.Teardown(context.Background(), p)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Teardown with a hanging plugin succeeded")
	}
	t.Logf("Teardown failed after %v: %v", took, err)
	if took > 500*time.Millisecond+pluginWaitDelay {
		t.Errorf("Teardown took %v with a 500ms timeout", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "crisp-hang") || !strings.Contains(err.Error(), "attempt 1 of 3") {
		t.Errorf("error: %v", err)
	}
	assertGone(t, f.hungPids("crisp-hang"))
	// DEL runs the list backwards: the hanging plugin first, then the fallback runs
	// the one it kept from running, and not the hanging one again.
	if got := [2]int{f.callCount("crisp-hang", "DEL"), f.callCount("crisp-ok", "DEL")}; got != [2]int{1, 1} {
		t.Errorf("DEL calls (hang, ok) = %v: %v", got, f.calls())
	}
	// Fixed: the retry succeeds and clears the failure count.
	f.set("crisp-hang", "DEL", "")
	if err := f.m.Teardown(context.Background(), p); err != nil {
		t.Fatalf("Teardown after the plugin was fixed: %v", err)
	}
	if n := f.m.failures[p.ID]; n != 0 {
		t.Errorf("failure count after success: %d", n)
	}
}

// TestDelFailureIsRetryableThenPending: a failing DEL is Unavailable for the first
// attempts; on the last the pod may go and the DEL is retried in the background,
// without the namespace, until the plugin works again.
func TestDelFailureIsRetryableThenPending(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-fail")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.set("crisp-fail", "DEL", "fail")
	for i := 1; i < teardownAttempts; i++ {
		err := f.m.Teardown(context.Background(), p)
		if err == nil {
			t.Fatalf("attempt %d: Teardown with a failing plugin succeeded", i)
		}
		if !errdefs.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("attempt %d: error is not (only) Unavailable: %v", i, err)
		}
		for _, w := range []string{"crisp-fail", "injected failure", `"fakenet"`, fmt.Sprintf("attempt %d of %d", i, teardownAttempts)} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("attempt %d: error does not mention %q: %v", i, w, err)
			}
		}
		if len(f.m.Pending()) != 0 {
			t.Fatalf("attempt %d: DEL already pending", i)
		}
	}
	if err := f.m.Teardown(context.Background(), p); err != nil {
		t.Fatalf("last attempt: %v", err)
	}
	if ids := f.m.Pending(); len(ids) != 1 || ids[0] != p.ID {
		t.Fatalf("pending = %v, want [%s]", ids, p.ID)
	}
	// Pending DELs are the retrier's: another teardown does not run the plugin.
	before := f.callCount("crisp-fail", "DEL")
	if err := f.m.Teardown(context.Background(), p); err != nil || f.callCount("crisp-fail", "DEL") != before {
		t.Errorf("Teardown of a pending pod: err %v, DEL calls %d -> %d", err, before, f.callCount("crisp-fail", "DEL"))
	}
	// Still failing: retried, kept.
	waitFor(t, 2*time.Second, func() bool { return f.callCount("crisp-fail", "DEL") > before })
	if len(f.m.Pending()) != 1 {
		t.Fatal("pending DEL dropped while the plugin still fails")
	}
	f.set("crisp-fail", "DEL", "")
	waitFor(t, 5*time.Second, func() bool { return len(f.m.Pending()) == 0 })
	if calls := f.calls(); calls[len(calls)-1] != "crisp-fail DEL netns=" {
		t.Errorf("the retried DEL was not run without the namespace: %q", calls)
	}
	if matches, _ := filepath.Glob(filepath.Join(f.dir, "cache", "results", "*"+p.ID+"*")); len(matches) > 0 {
		t.Errorf("CNI result cache left after the pending DEL: %v", matches)
	}
}

// TestPendingSurvivesRestart: a DEL left pending is picked up by the next Manager.
func TestPendingSurvivesRestart(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-fail")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.set("crisp-fail", "DEL", "fail")
	for range teardownAttempts {
		_ = f.m.Teardown(context.Background(), p)
	}
	f.m.Close()
	if len(f.m.Pending()) != 1 {
		t.Fatalf("pending = %v", f.m.Pending())
	}
	f.set("crisp-fail", "DEL", "")
	m2, err := New(f.m.cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	waitFor(t, 5*time.Second, func() bool { return len(m2.Pending()) == 0 })
}

// TestAddFailureUndoFailsGoesPending: when the DEL undoing a failed ADD fails too,
// nobody will ever stop the pod (kubelet never learned its id): the DEL is pending.
func TestAddFailureUndoFailsGoesPending(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-ok", "crisp-fail")
	f.set("crisp-fail", "ADD", "fail")
	f.set("crisp-ok", "DEL", "fail")
	p := fakePod()
	_, err := f.m.Setup(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "retried in the background") {
		t.Fatalf("Setup: %v", err)
	}
	if ids := f.m.Pending(); len(ids) != 1 || ids[0] != p.ID {
		t.Fatalf("pending = %v", ids)
	}
	f.set("crisp-ok", "DEL", "")
	waitFor(t, 5*time.Second, func() bool { return len(f.m.Pending()) == 0 })
}

// TestReleaseDefersAtOnce: undoing a creation, a failed DEL goes to the retrier at
// its first failure.
func TestReleaseDefersAtOnce(t *testing.T) {
	f := newFakeNet(t, 5*time.Second, "crisp-fail")
	p := fakePod()
	if _, err := f.m.Setup(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	f.set("crisp-fail", "DEL", "fail")
	if err := f.m.Release(context.Background(), p); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if ids := f.m.Pending(); len(ids) != 1 || ids[0] != p.ID {
		t.Fatalf("pending = %v", ids)
	}
	f.set("crisp-fail", "DEL", "")
	waitFor(t, 5*time.Second, func() bool { return len(f.m.Pending()) == 0 })
}

// TestCallerCancelIsNotTimeout: a caller that gives up is Canceled, not a timeout.
func TestCallerCancelIsNotTimeout(t *testing.T) {
	f := newFakeNet(t, time.Minute, "crisp-hang")
	f.set("crisp-hang", "ADD", "hang")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err := f.m.Setup(ctx, fakePod())
	if !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want Canceled", err)
	}
	assertGone(t, f.hungPids("crisp-hang"))
}

// TestPluginLeavingChildSucceeds: a plugin that succeeds but leaves a child holding
// its stdout is a success after pluginWaitDelay (libcni's RawExec would wait for the
// child for ever).
func TestPluginLeavingChildSucceeds(t *testing.T) {
	f := newFakeNet(t, time.Minute, "crisp-leave")
	f.set("crisp-leave", "ADD", "leave")
	t.Cleanup(func() {
		data, _ := os.ReadFile(filepath.Join(f.dir, "crisp-leave.pids"))
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	start := time.Now()
	res, err := f.m.Setup(context.Background(), fakePod())
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if took := time.Since(start); took > pluginWaitDelay+time.Second {
		t.Errorf("Setup took %v", took)
	}
	if res.IP.String() != "10.99.0.2" {
		t.Errorf("IP = %v", res.IP)
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
