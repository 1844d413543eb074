package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ctrdShimSandboxers are the handlers on which crisp's shim is containerd's sandbox
// and so writes the pod's resolv.conf, hostname and hosts itself.
var ctrdShimSandboxers = []string{"crisp-shim", "crisp-legacy-shim"}

// TestE2EContainerdDNS runs containerd 2.4.2 with crisp's shim as its sandboxer and
// sends RunPodSandbox a DNS config or hostname that would add a line of the caller's
// choosing to the pod's resolv.conf or hosts (containerd passes them on unchecked):
// the call fails with InvalidArgument naming the field, and no shim, pod directory,
// mount, netns or cgroup is left. A valid DNS config still gives a container exactly
// the resolv.conf it describes.
func TestE2EContainerdDNS(t *testing.T) {
	c := newContainerd(t)
	ctx := ctxT(t)
	if _, err := c.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: c.busybox}}); err != nil {
		t.Fatalf("pull %s: %v\n%s", c.busybox, err, c.logTail(4000))
	}
	t.Run("refused", func(t *testing.T) {
		for _, h := range ctrdShimSandboxers {
			t.Run(h, func(t *testing.T) { c.dnsRefused(ctx, t, h) })
		}
	})
	t.Run("valid", func(t *testing.T) {
		for _, h := range ctrdShimSandboxers {
			t.Run(h, func(t *testing.T) { c.dnsValid(ctx, t, h) })
		}
	})
}

// dnsRefused: each bad pod config fails RunPodSandbox with InvalidArgument and a
// message naming the field, and leaves nothing behind.
func (c *ctrd) dnsRefused(ctx context.Context, t *testing.T, h string) {
	before := c.leftovers()
	for _, tc := range []struct {
		name string
		edit func(*cri.PodSandboxConfig)
		want string
	}{
		{"option with a line break", func(p *cri.PodSandboxConfig) {
			p.DnsConfig = &cri.DNSConfig{Servers: []string{"10.0.0.10"}, Options: []string{"ndots:5\nnameserver 203.0.113.9"}}
		}, "dns_config.options[0]"},
		{"search with a line break", func(p *cri.PodSandboxConfig) {
			p.DnsConfig = &cri.DNSConfig{Servers: []string{"10.0.0.10"}, Searches: []string{"svc.e2e.local\nnameserver 203.0.113.9"}}
		}, "dns_config.searches[0]"},
		{"four servers", func(p *cri.PodSandboxConfig) {
			p.DnsConfig = &cri.DNSConfig{Servers: []string{"10.0.0.10", "10.0.0.11", "10.0.0.12", "203.0.113.9"}}
		}, "4 servers, at most 3"},
		{"hostname with a line break", func(p *cri.PodSandboxConfig) {
			p.Hostname = "dns-bad\n203.0.113.9\tevil"
		}, "hostname"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := c.podConfig("dns-bad-" + h)
			tc.edit(pod)
			resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: h})
			if err == nil {
				// What crisp's shim wrote for the pod, to show what got through.
				var written []byte
				_ = filepath.Walk(c.dir, func(p string, info os.FileInfo, err error) error {
					if err == nil && info.Name() == "resolv.conf" && strings.Contains(p, resp.PodSandboxId) {
						b, _ := os.ReadFile(p)
						written = append(written, p+":\n"+string(b)...)
					}
					return nil
				})
				c.removePod(ctx, t, resp.PodSandboxId)
				t.Fatalf("RunPodSandbox on %s took %s; the pod's resolv.conf:\n%s", h, tc.name, written)
			}
			t.Logf("RunPodSandbox on %s: %v", h, err)
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
				t.Errorf("RunPodSandbox on %s: %v; want InvalidArgument naming %q", h, err, tc.want)
			}
			if d := shimSandboxDirs(c); len(d) > 0 {
				t.Errorf("pod directories left by crisp's shim: %v", d)
			}
			if f := filesHolding("203.0.113.9", c.state, filepath.Join(c.root, "io.containerd.grpc.v1.cri")); len(f) > 0 {
				t.Errorf("files hold the injected address: %v", f)
			}
			c.assertClean(t, 20*time.Second, before)
		})
	}
}

// dnsValid: kubelet's largest DNS config (3 servers, IPv6 among them, searches and
// options) reaches the container as the resolv.conf it describes, line for line.
func (c *ctrd) dnsValid(ctx context.Context, t *testing.T, h string) {
	before := c.leftovers()
	pod := c.podConfig("dns-ok-" + h)
	pod.DnsConfig = &cri.DNSConfig{
		Servers:  []string{"10.0.0.10", "fd00::10", "10.0.0.11"},
		Searches: []string{"ns.svc.e2e.local", "svc.e2e.local", "e2e.local"},
		Options:  []string{"ndots:5", "edns0", "timeout:1"},
	}
	podID := c.runPod(ctx, t, pod, h)
	defer c.assertClean(t, 20*time.Second, before)
	defer c.removePod(ctx, t, podID)
	ctr, err := c.createStart(ctx, podID, pod, c.ctrConfig("resolv", "cat", "/etc/resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cs := c.waitExit(ctx, t, ctr, 30*time.Second)
	want := "stdout search ns.svc.e2e.local svc.e2e.local e2e.local|stdout nameserver 10.0.0.10|stdout nameserver fd00::10|" +
		"stdout nameserver 10.0.0.11|stdout options ndots:5 edns0 timeout:1"
	// containerd copies the output from FIFOs, after the exit event.
	var got string
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got = strings.Join(readLogIfAny(t, cs.LogPath), "|")
	}
	if got != want {
		t.Errorf("the container's /etc/resolv.conf (log lines joined by |):\n got %q\nwant %q", got, want)
	}
	if cs.ExitCode != 0 {
		t.Errorf("cat /etc/resolv.conf exited %d", cs.ExitCode)
	}
}

// shimSandboxDirs lists the sandbox directories containerd's shim sandboxer keeps in
// its state dir, where crisp's shim writes the pod's files (leftovers does not look
// there).
func shimSandboxDirs(c *ctrd) []string {
	entries, _ := os.ReadDir(filepath.Join(c.state, "io.containerd.sandbox.controller.v1.shim", "k8s.io"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// filesHolding lists the regular files below dirs (a pod's bundles and files) whose
// bytes contain s.
func filesHolding(s string, dirs ...string) []string {
	var out []string
	for _, dir := range dirs {
		_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err != nil || !info.Mode().IsRegular() || info.Size() > 1<<20 {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}
