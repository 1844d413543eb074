package e2e

import (
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// podFiles: a pod's containers get its DNS config in /etc/resolv.conf, its hostname in
// /etc/hostname, an /etc/hosts and one /dev/shm they share, on every handler: under
// containerd's podsandbox containerd writes and mounts them, under the shim sandboxer
// crisp's shim does (containerd mounts only files it wrote itself). A read-only rootfs
// gets them read-only, and removing the pod leaves no /dev/shm mount (assertClean).
func (c *ctrd) podFiles(t *testing.T) {
	ctx := ctxT(t)
	before := c.leftovers()
	for _, h := range append(ctrdHandlers, ctrdLegacyHandlers...) {
		t.Run(h, func(t *testing.T) {
			pod := c.podConfig("pf-" + h)
			pod.DnsConfig = &cri.DNSConfig{Servers: []string{"10.0.0.10", "10.0.0.11"}, Searches: []string{"svc.e2e.local"}, Options: []string{"ndots:5"}}
			podID := c.runPod(ctx, t, pod, h)
			defer c.removePod(ctx, t, podID)
			writer, err := c.createStart(ctx, podID, pod, c.ctrConfig("shm-writer", "sh", "-c", "echo shared > /dev/shm/marker; sleep 3600"))
			if err != nil {
				t.Fatal(err)
			}
			// The reader starts once the marker is there: /dev/shm is the pod's.
			waitFor(t, 20*time.Second, "the writer's marker", func() bool {
				r, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: writer, Cmd: []string{"cat", "/dev/shm/marker"}, Timeout: 10})
				return err == nil && string(r.Stdout) == "shared\n"
			})
			cfg := c.ctrConfig("reader", "sh", "-c",
				"cat /etc/resolv.conf; echo host=$(cat /etc/hostname); echo shm=$(cat /dev/shm/marker); "+
					"grep -E ' /etc/(resolv.conf|hostname|hosts) ' /proc/self/mounts | cut -d' ' -f2,4 | cut -d, -f1 | sort")
			cfg.Linux.SecurityContext.ReadonlyRootfs = true
			reader, err := c.createStart(ctx, podID, pod, cfg)
			if err != nil {
				t.Fatal(err)
			}
			cs := c.waitExit(ctx, t, reader, 30*time.Second)
			// containerd copies the output from FIFOs, after the exit event.
			var out []string
			waitFor(t, 10*time.Second, "the reader's log", func() bool {
				out = readLogIfAny(t, cs.LogPath)
				return strings.Contains(strings.Join(out, "|"), "/etc/resolv.conf")
			})
			want := []string{
				"stdout search svc.e2e.local", "stdout nameserver 10.0.0.10", "stdout nameserver 10.0.0.11", "stdout options ndots:5",
				"stdout host=pf-" + h, "stdout shm=shared",
				"stdout /etc/hostname ro", "stdout /etc/hosts ro", "stdout /etc/resolv.conf ro",
			}
			joined := strings.Join(out, "|")
			for _, w := range want {
				if !strings.Contains(joined, w) {
					t.Errorf("%s: no %q in the reader's output:\n%s", h, w, strings.Join(out, "\n"))
				}
			}
			if cs.ExitCode != 0 {
				t.Errorf("%s: reader exited %d", h, cs.ExitCode)
			}
		})
	}
	c.assertClean(t, 20*time.Second, before)
}
