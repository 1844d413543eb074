package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// withRunsc adds gVisor's shim from bin to a containerd as the handler gvisorHandler,
// configured as gVisor documents it for containerd (runtime_type
// io.containerd.runsc.v1, found as containerd-shim-runsc-v1 on containerd's PATH;
// options TypeUrl and ConfigPath to a runsc TOML), under containerd's pause container.
func withRunsc(t *testing.T, bin string) ctrdOption {
	return func(c *ctrd, config *string) {
		toml, _ := writeRunscTOML(t, bin, c.dir)
		if err := os.Symlink(filepath.Join(bin, "containerd-shim-runsc-v1"), filepath.Join(c.dir, "bin", "containerd-shim-runsc-v1")); err != nil {
			t.Fatal(err)
		}
		const rt = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes." + gvisorHandler + "]"
		*config += fmt.Sprintf("\n%s\n  runtime_type = 'io.containerd.runsc.v1'\n  sandboxer = 'podsandbox'\n"+
			"%s\n  TypeUrl = 'io.containerd.runsc.v1.options'\n  ConfigPath = %q\n",
			rt, strings.TrimSuffix(rt, "]")+".options]", toml)
	}
}

// newContainerdGVisor starts containerd 2.4.2 with runsc from bin as the handler
// gvisorHandler; without containerd's build it returns nil and why.
func newContainerdGVisor(t *testing.T, bin string) (*gvTarget, string) {
	t.Helper()
	cache := os.Getenv("CONTAINERD_CACHE")
	if cache == "" {
		cache = "/var/cache/crisp/containerd-v" + containerdVersion
	}
	if _, err := os.Stat(filepath.Join(cache, "bin", "containerd")); err != nil {
		return nil, fmt.Sprintf("containerd %s is not built (%v): hack/containerd.sh builds it", containerdVersion, err)
	}
	c := newContainerd(t, withRunsc(t, bin))
	ctx := ctxT(t)
	for _, ref := range []string{c.busybox, c.pause} {
		if _, err := c.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("containerd: pull %s: %v\n%s", ref, err, c.logTail(4000))
		}
	}
	before := c.leftovers()
	return &gvTarget{
		name:   "containerd",
		rt:     func() cri.RuntimeServiceClient { return c.rt },
		img:    c.busybox,
		pod:    c.podConfig,
		cgroup: c.cgroup,
		restart: func(t *testing.T) {
			c.restart(syscall.SIGKILL)
		},
		shimPid: func(t *testing.T, podID string) int {
			t.Helper()
			dirs, _ := os.ReadDir("/proc")
			for _, d := range dirs {
				b, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
				args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
				if filepath.Base(args[0]) != "containerd-shim-runsc-v1" || !strings.Contains(string(b), c.dir+"/") {
					continue
				}
				for i, a := range args[:len(args)-1] {
					if a == "-id" && args[i+1] == podID {
						pid, _ := strconv.Atoi(d.Name())
						return pid
					}
				}
			}
			t.Fatalf("containerd: no gVisor shim for pod %s: %v", podID, c.shims())
			return 0
		},
		runscRoot: filepath.Join(c.dir, "runsc-root"),
		clean: func(t *testing.T) {
			t.Helper()
			// runsc pins one empty network namespace per root at its first sandbox and
			// keeps it: runsc's state, not a pod's.
			c.assertClean(t, 20*time.Second, append(before, "mount "+filepath.Join(c.dir, "runsc-root", "k8s.io", "null-netns")))
		},
	}, ""
}
