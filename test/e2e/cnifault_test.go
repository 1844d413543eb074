package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// faultTimeout is the cni.timeout_seconds the fault tests run criserver with.
const faultTimeout = 2 * time.Second

// faultPluginScript wraps Debian's bridge plugin. What it does for a command is read
// from CTL/<COMMAND>: "fail" fails before bridge runs, "fail-after" after bridge made
// the veth and reserved the IP (a chained plugin failing half-way), "hang" and
// "hang-after" start a child that keeps stdout open and wait for it, as a plugin stuck
// on a lock or an unreachable datastore does; anything else is plain bridge. Every call
// is logged to CTL/calls, the pids of hanging calls to CTL/pids.
const faultPluginScript = `#!/bin/sh
ctl=%q
mode=$(cat "$ctl/$CNI_COMMAND" 2>/dev/null)
echo "$CNI_COMMAND $mode netns=$CNI_NETNS" >> "$ctl/calls"
hang() { echo $$ >> "$ctl/pids"; sleep 600 & echo $! >> "$ctl/pids"; wait; exit 1; }
case "$mode" in
fail) echo '{"cniVersion":"1.0.0","code":11,"msg":"crisp-fault: injected failure"}'; exit 1 ;;
hang) hang ;;
esac
out=$(/usr/lib/cni/bridge)
rc=$?
case "$mode" in
fail-after) echo '{"cniVersion":"1.0.0","code":11,"msg":"crisp-fault: injected failure after bridge"}'; exit 1 ;;
hang-after) hang ;;
esac
printf '%%s' "$out"
exit $rc
`

// faultEnv is an env whose pod network is the bridge behind the fault plugin.
type faultEnv struct {
	*env
	ctl string // control dir of the fault plugin
}

// newFaultEnv prepares criserver with a network of crisp-fault (wrapping bridge, with
// host-local IPAM under the env's root) and portmap, a bin dir holding crisp-fault
// listed first, and a CNI timeout of faultTimeout.
func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("needs Debian's containernetworking-plugins in /usr/lib/cni")
	}
	e := newEnv(t)
	f := &faultEnv{env: e, ctl: filepath.Join(e.dir, "fault")}
	bin := filepath.Join(e.dir, "faultbin")
	for _, d := range []string{f.ctl, bin, filepath.Join(e.dir, "net.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "crisp-fault"), fmt.Appendf(nil, faultPluginScript, f.ctl), 0o755); err != nil {
		t.Fatal(err)
	}
	// No ipMasq: NAT rules of a pod whose DEL never ran would outlive the test.
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"crisp-fault","plugins":[
		{"type":"crisp-fault","bridge":%q,"isGateway":true,"ipMasq":false,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}},
		{"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}`,
		e.bridge, e.subnet, filepath.Join(e.root, "cni", "networks"))
	if err := os.WriteFile(filepath.Join(e.dir, "net.d", "10-crisp-fault.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("[cni]\nbin_dirs = [%q, \"/usr/lib/cni\"]\ntimeout_seconds = %d\n", bin, int(faultTimeout/time.Second))
	cfg = []byte(strings.Replace(string(cfg), "[cni]\n", extra, 1))
	if err := os.WriteFile(e.cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// set makes the fault plugin answer cmd (ADD, DEL) with mode ("" is plain bridge).
func (f *faultEnv) set(cmd, mode string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.ctl, cmd), []byte(mode), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// calls counts the fault plugin's calls of cmd so far.
func (f *faultEnv) calls(cmd string) int {
	data, _ := os.ReadFile(filepath.Join(f.ctl, "calls"))
	return strings.Count(string(data), cmd+" ")
}

// assertHungPluginsGone checks that every hanging plugin call was killed with its
// child: none runs, and none is a zombie criserver did not reap.
func (f *faultEnv) assertHungPluginsGone(t *testing.T) {
	t.Helper()
	data, _ := os.ReadFile(filepath.Join(f.ctl, "pids"))
	pids := strings.Fields(string(data))
	if len(pids) == 0 {
		t.Error("no hanging plugin call recorded")
	}
	deadline := time.Now().Add(3 * time.Second)
	for _, s := range pids {
		pid, _ := strconv.Atoi(s)
		for alive(pid) || f.zombieOfCriserver(pid) {
			if time.Now().After(deadline) {
				t.Errorf("hanging plugin process %d still there", pid)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (f *faultEnv) zombieOfCriserver(pid int) bool {
	if f.cmd == nil {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 1 && fields[1] == strconv.Itoa(f.cmd.Process.Pid)
}

// normalPod runs a pod through the fault plugin in pass-through mode, checks it got
// an address, and removes it leaving nothing.
func (f *faultEnv) normalPod(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	f.set("ADD", "")
	f.set("DEL", "")
	id := f.runPod(ctx, f.podConfig(name))
	st, info := f.status(ctx, id)
	if st.GetNetwork().GetIp() == "" {
		t.Errorf("pod %s has no IP", name)
	}
	f.stopRemove(ctx, t, id)
	f.assertPodGone(t, id, info)
	f.assertNodeClean(t)
}

// TestE2ECNIFaultAdd: a CNI ADD that fails or hangs, before or after bridge made the
// veth and reserved the IP, fails RunPodSandbox and leaves nothing; criserver then
// serves pods as before.
func TestE2ECNIFaultAdd(t *testing.T) {
	f := newFaultEnv(t)
	f.start()
	ctx := ctxT(t)
	// A first pod creates what stays for the node's life (the bridge, host-local's
	// lock file): the baseline is taken after it.
	f.normalPod(ctx, t, "warmup")
	base := f.leakSnapshot(t)
	for _, tc := range []struct {
		mode string
		code codes.Code
		want string
	}{
		{"fail", codes.Unknown, "crisp-fault: injected failure"},
		{"fail-after", codes.Unknown, "injected failure after bridge"},
		{"hang", codes.DeadlineExceeded, "did not finish within 2s"},
		{"hang-after", codes.DeadlineExceeded, "did not finish within 2s"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			f.set("ADD", tc.mode)
			dels := f.calls("DEL")
			start := time.Now()
			_, err := f.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: f.podConfig("add-" + tc.mode)})
			took := time.Since(start)
			if err == nil {
				t.Fatal("RunPodSandbox succeeded")
			}
			t.Logf("RunPodSandbox failed after %v: %v", took.Round(time.Millisecond), err)
			if c := status.Code(err); c != tc.code {
				t.Errorf("code %v, want %v", c, tc.code)
			}
			for _, w := range []string{tc.want, `type="crisp-fault"`, `network "crisp-fault"`} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q", w)
				}
			}
			if strings.HasPrefix(tc.mode, "hang") {
				if took > faultTimeout+3*time.Second {
					t.Errorf("RunPodSandbox took %v with a %v CNI timeout", took, faultTimeout)
				}
				f.assertHungPluginsGone(t)
			}
			// The undo ran DEL even when ADD failed half-way.
			if f.calls("DEL") == dels {
				t.Error("no CNI DEL after the failed ADD")
			}
			list, err := f.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
			if err != nil || len(list.GetItems()) != 0 {
				t.Errorf("ListPodSandbox after the failed RunPodSandbox: %v, err %v", list.GetItems(), err)
			}
			f.assertNodeClean(t)
			f.assertNoLeaks(t, base, 5*time.Second)
		})
	}
	// ADD works but the pod fails later (a sysctl the kernel refuses, written by the
	// pause process) and the DEL undoing it fails: kubelet never learns of the pod, so
	// it goes at once, and its IP is released in the background once DEL works.
	t.Run("later-failure-del-fails", func(t *testing.T) {
		f.set("ADD", "")
		f.set("DEL", "fail")
		cfg := f.podConfig("undo-del-fails")
		cfg.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "not-a-number"}
		_, err := f.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
		if err == nil || !strings.Contains(err.Error(), "ip_forward") {
			t.Fatalf("RunPodSandbox: %v", err)
		}
		list, err := f.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err != nil || len(list.GetItems()) != 0 {
			t.Errorf("ListPodSandbox after the failed RunPodSandbox: %v, err %v", list.GetItems(), err)
		}
		if r := f.ipamReservations(); len(r) != 1 {
			t.Errorf("IPAM reservations while the DEL is pending: %v", r)
		}
		f.set("DEL", "")
		f.waitIPReleased(t, 40*time.Second)
		f.assertNodeClean(t)
		f.assertNoLeaks(t, base, 5*time.Second)
	})

	f.normalPod(ctx, t, "after")
	f.assertNoLeaks(t, base, 5*time.Second)
}

// waitIPReleased waits for host-local to hold no reservation of the env's subnet.
func (f *faultEnv) waitIPReleased(t *testing.T, within time.Duration) {
	t.Helper()
	start := time.Now()
	for len(f.ipamReservations()) != 0 {
		if time.Since(start) > within {
			t.Fatalf("IP still reserved %v after the plugin was fixed", within)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pending DEL released the IP %v after the plugin was fixed", time.Since(start).Round(time.Millisecond))
}

// TestE2ECNIFaultDel: a CNI DEL that fails or hangs fails StopPodSandbox and
// RemovePodSandbox (retryable, naming the plugin) and keeps the netns and the IP for
// the retry; once the plugin works a retry leaves nothing. A DEL that keeps failing
// lets the pod go on the third attempt, without its netns and veth, and the IP is
// released in the background once the plugin works again, also after a restart.
func TestE2ECNIFaultDel(t *testing.T) {
	f := newFaultEnv(t)
	f.start()
	ctx := ctxT(t)
	f.normalPod(ctx, t, "warmup")
	base := f.leakSnapshot(t)

	for _, tc := range []struct {
		mode string
		code codes.Code
		want string
	}{
		{"fail", codes.Unavailable, "crisp-fault: injected failure"},
		{"hang", codes.DeadlineExceeded, "did not finish within 2s"},
	} {
		t.Run(tc.mode+"-then-works", func(t *testing.T) {
			f.set("DEL", "")
			id := f.runPod(ctx, f.podConfig("del-"+tc.mode))
			_, info := f.status(ctx, id)
			f.set("DEL", tc.mode)
			// Stop, then Remove: both fail while DEL does.
			for i, call := range []func() error{
				func() error {
					_, err := f.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
					return err
				},
				func() error {
					_, err := f.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
					return err
				},
			} {
				start := time.Now()
				err := call()
				took := time.Since(start)
				if err == nil {
					t.Fatalf("call %d succeeded while CNI DEL fails", i+1)
				}
				t.Logf("call %d failed after %v: %v", i+1, took.Round(time.Millisecond), err)
				if c := status.Code(err); c != tc.code {
					t.Errorf("code %v, want %v", c, tc.code)
				}
				for _, w := range []string{tc.want, `type="crisp-fault"`, `network "crisp-fault"`, fmt.Sprintf("attempt %d of 3", i+1)} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not mention %q", w)
					}
				}
				if tc.mode == "hang" && took > faultTimeout+3*time.Second {
					t.Errorf("call took %v with a %v CNI timeout", took, faultTimeout)
				}
			}
			if tc.mode == "hang" {
				f.assertHungPluginsGone(t)
			}
			// The pod's processes are gone; what DEL needs is kept for the retry.
			if alive(info.Pid) {
				t.Errorf("pause %d still runs after the failed stop", info.Pid)
			}
			if _, err := os.Stat(info.NetNS); err != nil {
				t.Errorf("netns pin gone before DEL succeeded: %v", err)
			}
			if r := f.ipamReservations(); len(r) != 1 {
				t.Errorf("IPAM reservations while DEL fails: %v", r)
			}
			f.set("DEL", "")
			f.stopRemove(ctx, t, id)
			f.assertPodGone(t, id, info)
			f.assertNodeClean(t)
			f.assertNoLeaks(t, base, 5*time.Second)
		})
	}

	t.Run("fails-for-good", func(t *testing.T) {
		f.set("DEL", "")
		id := f.runPod(ctx, f.podConfig("del-forever"))
		_, info := f.status(ctx, id)
		f.set("DEL", "fail")
		for i := 1; i < 3; i++ {
			if _, err := f.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err == nil {
				t.Fatalf("StopPodSandbox %d succeeded while CNI DEL fails", i)
			}
		}
		// The third attempt lets the pod go: no netns, no veth, no processes; the IP
		// stays reserved (only the plugin can free it) until the plugin works.
		f.stopRemove(ctx, t, id)
		f.assertPodGone(t, id, info)
		if v := f.vethsOnBridge(); len(v) != 0 {
			t.Errorf("veths left after the netns was removed: %v", v)
		}
		if r := f.ipamReservations(); len(r) != 1 {
			t.Errorf("IPAM reservations while DEL is pending: %v", r)
		}
		list, err := f.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
		if err != nil || len(list.GetItems()) != 0 {
			t.Errorf("ListPodSandbox after removal: %v, err %v", list.GetItems(), err)
		}
		// The pending DEL survives a restart of criserver.
		f.stop()
		f.start()
		f.set("DEL", "")
		f.waitIPReleased(t, 40*time.Second)
		f.assertNodeClean(t)
		f.assertNoLeaks(t, base, 5*time.Second)
	})

	f.normalPod(ctx, t, "after")
	f.assertNoLeaks(t, base, 5*time.Second)
}
