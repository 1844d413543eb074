package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// nodeBlockDevice is the node's first real block device (not a loop, ram, zram,
// CD-ROM or nbd device): its name in /sys/block and its major and minor numbers.
func nodeBlockDevice(t *testing.T) (name string, major, minor uint64) {
	t.Helper()
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range ents {
		n := en.Name()
		if strings.HasPrefix(n, "loop") || strings.HasPrefix(n, "ram") || strings.HasPrefix(n, "zram") ||
			strings.HasPrefix(n, "sr") || strings.HasPrefix(n, "nbd") {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/sys/block", n, "dev"))
		if err != nil {
			continue
		}
		if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d:%d", &major, &minor); err != nil {
			t.Fatalf("/sys/block/%s/dev: %q: %v", n, data, err)
		}
		if _, err := os.Stat("/dev/" + n); err != nil {
			t.Fatalf("block device %s (%d:%d) has no node in /dev: %v", n, major, minor, err)
		}
		return n, major, minor
	}
	t.Fatal("no block device in /sys/block other than loop, ram, zram, sr and nbd")
	return "", 0, 0
}

// nodeCDISpec is a CDI spec (YAML) naming the host block device HOST as
// crisp.test/nodeblk=disk, at /dev/crisp-disk in the container, read access only.
const nodeCDISpec = `cdiVersion: "0.6.0"
kind: crisp.test/nodeblk
devices:
  - name: disk
    containerEdits:
      deviceNodes:
        - path: /dev/crisp-disk
          hostPath: HOST
          permissions: r
`

// TestNodeDevices: cgroup v2's eBPF device filter, as the node's runc applies it under
// either driver. In a non-privileged container /dev/null and /dev/zero work and the
// host's block devices are absent; a node for the host's disk made inside (mknod,
// allowed by runc's default rules, or refused) cannot be opened: "Operation not
// permitted". The same disk given as a CDI device (a spec file in /var/run/cdi, one of
// the packaged config's default spec dirs, requested through CDIDevices) can be read
// from another non-privileged container. A privileged container (in a privileged pod) sees
// the host's /dev and reads the disk. The disk is only ever read.
func TestNodeDevices(t *testing.T) {
	e := newNodeEnv(t)
	ctx := nodeCtx(t, 4*time.Minute)
	start := time.Now()
	disk, major, minor := nodeBlockDevice(t)
	t.Logf("host block device %s %d:%d", disk, major, minor)

	const specDir = "/var/run/cdi"
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(specDir, "crisp-node-e2e.yaml")
	if err := os.WriteFile(specPath, []byte(strings.Replace(nodeCDISpec, "HOST", "/dev/"+disk, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(specPath) })

	img := e.busybox(ctx)
	p := e.runTracedPod(ctx, t, "devices", func(c *cri.PodSandboxConfig) { c.Linux.SecurityContext.Privileged = true })

	// Not in the same container: the CDI device's rule would allow the disk's numbers.
	plain := p.run(ctx, t, e, ctrConfig("plain", img, "sleep", "3600"))
	cdiCfg := ctrConfig("cdi", img, "sleep", "3600")
	cdiCfg.CDIDevices = []*cri.CDIDevice{{Name: "crisp.test/nodeblk=disk"}}
	withCDI := p.run(ctx, t, e, cdiCfg)
	privCfg := ctrConfig("priv", img, "sleep", "3600")
	privCfg.Linux.SecurityContext.Privileged = true
	priv := p.run(ctx, t, e, privCfg)

	t.Run("dev-null", func(t *testing.T) {
		if got := e.tracedExec(ctx, t, plain, "sh", "-c", "echo x > /dev/null && cat /dev/null && head -c 4 /dev/zero | wc -c"); strings.TrimSpace(got) != "4" {
			t.Errorf("/dev/null and /dev/zero: %q", got)
		}
		if resp, err := e.execSync(ctx, plain, 60, "ls", "/dev/"+disk); err != nil || resp.ExitCode == 0 {
			t.Errorf("the host's /dev/%s is in a non-privileged container: %v %s", disk, err, resp.GetStdout())
		}
	})

	t.Run("host-block-device-refused", func(t *testing.T) {
		mk, err := e.execSync(ctx, plain, 60, "mknod", "/tmp/blk", "b", strconv.FormatUint(major, 10), strconv.FormatUint(minor, 10))
		if err != nil {
			t.Fatalf("ExecSync mknod: %v", err)
		}
		if mk.ExitCode != 0 {
			// Refused already at mknod: as good, when it is the device filter.
			if !strings.Contains(string(mk.Stderr), "Operation not permitted") {
				t.Errorf("mknod of %d:%d refused with %q, want Operation not permitted", major, minor, mk.Stderr)
			}
			t.Logf("mknod of the host's disk refused: %s", strings.TrimSpace(string(mk.Stderr)))
			return
		}
		rd, err := e.execSync(ctx, plain, 60, "head", "-c", "1", "/tmp/blk")
		if err != nil {
			t.Fatalf("ExecSync head: %v", err)
		}
		if rd.ExitCode == 0 || len(rd.Stdout) != 0 || !strings.Contains(string(rd.Stderr), "Operation not permitted") {
			t.Errorf("reading the host's disk %d:%d through a node made inside: exit %d, %d bytes, stderr %q; want Operation not permitted",
				major, minor, rd.ExitCode, len(rd.Stdout), rd.Stderr)
		}
	})

	t.Run("cdi-device", func(t *testing.T) {
		want := fmt.Sprintf("block special file %x:%x", major, minor)
		if got := strings.TrimSpace(e.tracedExec(ctx, t, withCDI, "stat", "-c", "%F %t:%T", "/dev/crisp-disk")); got != want {
			t.Errorf("CDI device node /dev/crisp-disk: %q, want %q", got, want)
		}
		if got := strings.TrimSpace(e.tracedExec(ctx, t, withCDI, "sh", "-c", "head -c 512 /dev/crisp-disk | wc -c")); got != "512" {
			t.Errorf("reading the CDI device: %q bytes, want 512", got)
		}
	})

	t.Run("privileged", func(t *testing.T) {
		want := fmt.Sprintf("block special file %x:%x", major, minor)
		if got := strings.TrimSpace(e.tracedExec(ctx, t, priv, "stat", "-c", "%F %t:%T", "/dev/"+disk)); got != want {
			t.Errorf("/dev/%s in the privileged container: %q, want %q", disk, got, want)
		}
		if got := strings.TrimSpace(e.tracedExec(ctx, t, priv, "sh", "-c", "head -c 512 /dev/"+disk+" | wc -c")); got != "512" {
			t.Errorf("reading /dev/%s in the privileged container: %q bytes, want 512", disk, got)
		}
	})

	e.removeTraced(ctx, t, p)
	t.Logf("TestNodeDevices (%s driver) took %v", nodeDriver(), time.Since(start).Round(time.Millisecond))
}

// TestNodeUserNamespace: a pod with hostUsers: false (mode POD, container 0 -> host
// 196608, 65536 ids, as kubelet allocates them) on the node's kernel (Debian 12: 6.1).
// The runtime handler advertises user namespaces; inside, the container is root with
// the pod's mapping in /proc/self/uid_map and gid_map, the image's files are root's
// (idmapped overlay layers) and so is a root-owned file of a hostPath volume (an
// idmapped bind). On the host the process runs as 196608, and what it writes shows as
// 196608 through its mounts while on disk a volume file keeps the in-container id (0,
// or 1000 after a chown), as with containerd's idmapped volumes. A tmpfs volume (an
// emptyDir of medium Memory) needs idmapped tmpfs (Linux 6.3): below, the container
// fails to start with an error; from 6.3 it works.
func TestNodeUserNamespace(t *testing.T) {
	e := newNodeEnv(t)
	ctx := nodeCtx(t, 4*time.Minute)
	start := time.Now()
	const hostID = 3 * 65536
	mapping := fmt.Sprintf("0 %d 65536", hostID)

	st, err := e.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Every handler of the package's config but wasm, whose modules join no namespace
	// (its shim's -info lists none).
	for _, h := range st.RuntimeHandlers {
		if got, want := h.GetFeatures().GetUserNamespaces(), h.Name != wasmHandler; got != want {
			check, _ := exec.Command("/usr/bin/criserver", "--config", e.cfgPath, "check").CombinedOutput()
			t.Fatalf("handler %q advertises user_namespaces %v on kernel %s, want %v; criserver check:\n%s", h.Name, got, kernelRelease(), want, check)
		}
	}

	// The volumes: a hostPath directory with a root-owned file, and an emptyDir as
	// kubelet makes it (a 0777 directory below the pod's directory).
	vols := kubeletVolumes(t)
	hostPath := filepath.Join(vols, "hostpath")
	emptyDir := filepath.Join(vols, "pods", "userns", "volumes", "kubernetes.io~empty-dir", "cache")
	for dir, mode := range map[string]os.FileMode{hostPath: 0o755, emptyDir: 0o777} {
		if err := os.MkdirAll(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(hostPath, "hostfile"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	img := e.busybox(ctx)
	p := e.runTracedPod(ctx, t, "userns", func(c *cri.PodSandboxConfig) {
		c.Linux.SecurityContext.NamespaceOptions.UsernsOptions = usernsOptions(hostID, 65536)
	})
	cfg := ctrConfig("userns", img, "sleep", "3600")
	// kubelet copies the pod's namespace options into every container's.
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{UsernsOptions: usernsOptions(hostID, 65536)}
	cfg.Mounts = []*cri.Mount{{ContainerPath: "/data", HostPath: hostPath}, {ContainerPath: "/cache", HostPath: emptyDir}}
	id := p.run(ctx, t, e, cfg)
	pid := e.ctrPid(ctx, id)

	run := func(cmd ...string) string { t.Helper(); return strings.TrimSpace(e.tracedExec(ctx, t, id, cmd...)) }
	if got := run("sh", "-c", "id -u; id -g"); got != "0\n0" {
		t.Errorf("id -u; id -g inside: %q, want 0 0", got)
	}
	for _, f := range []string{"uid_map", "gid_map"} {
		if got := strings.Join(strings.Fields(run("cat", "/proc/self/"+f)), " "); got != mapping {
			t.Errorf("/proc/self/%s inside: %q, want %q", f, got, mapping)
		}
	}
	if got := run("stat", "-c", "%u:%g", "/bin/busybox", "/etc", "/data/hostfile"); got != "0:0\n0:0\n0:0" {
		t.Errorf("owners of /bin/busybox, /etc (image) and /data/hostfile (hostPath) inside: %q, want 0:0 each (idmapped)", got)
	}
	run("sh", "-c", "echo hi > /written && echo hi > /data/written && echo hi > /cache/written && "+
		"echo hi > /cache/u1000 && chown 1000:1000 /cache/u1000")

	// The host's view.
	for _, field := range []string{"Uid", "Gid"} {
		if got := procStatusID(t, pid, field); got != strconv.Itoa(hostID) {
			t.Errorf("container process %s on the host: %s, want %d", field, got, hostID)
		}
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	for path, want := range map[string]uint32{
		// Through the container's mounts: the mapped ids.
		root + "/bin/busybox":  hostID,
		root + "/written":      hostID,
		root + "/data/written": hostID,
		root + "/cache/u1000":  hostID + 1000,
		// On disk, in the volumes: the in-container ids (idmapped binds never chown).
		filepath.Join(hostPath, "written"):  0,
		filepath.Join(hostPath, "hostfile"): 0,
		filepath.Join(emptyDir, "written"):  0,
		filepath.Join(emptyDir, "u1000"):    1000,
	} {
		if got := fileUID(t, path); got != want {
			t.Errorf("%s owned by %d on the host, want %d", path, got, want)
		}
	}

	t.Run("tmpfs-volume", func(t *testing.T) {
		var maj, min int
		if _, err := fmt.Sscanf(kernelRelease(), "%d.%d", &maj, &min); err != nil {
			t.Fatalf("kernel release %q: %v", kernelRelease(), err)
		}
		idmappedTmpfs := maj > 6 || maj == 6 && min >= 3
		mem := filepath.Join(vols, "pods", "userns", "volumes", "kubernetes.io~empty-dir", "mem")
		if err := os.MkdirAll(mem, 0o755); err != nil {
			t.Fatal(err)
		}
		opts := "mode=0777,size=1m"
		// Under SELinux kubelet mounts a memory emptyDir with a context; the one of
		// kubelet's volume directories here.
		if l, err := selinux.FileLabel(vols); err == nil && l != "" && selinux.GetEnabled() {
			opts += ",context=\"" + l + "\""
		}
		if err := syscall.Mount("tmpfs", mem, "tmpfs", 0, opts); err != nil {
			t.Fatalf("mount tmpfs: %v", err)
		}
		defer syscall.Unmount(mem, syscall.MNT_DETACH)
		mcfg := ctrConfig("userns-tmpfs", img, "sh", "-c", "echo hi > /mem/written && exec sleep 3600")
		mcfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{UsernsOptions: usernsOptions(hostID, 65536)}
		mcfg.Mounts = []*cri.Mount{{ContainerPath: "/mem", HostPath: mem}}
		cr, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.id, Config: mcfg, SandboxConfig: p.kp.cfg})
		if err == nil {
			p.ctrs = append(p.ctrs, cr.ContainerId)
			_, err = e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: cr.ContainerId})
		}
		if idmappedTmpfs {
			if err != nil {
				t.Fatalf("tmpfs volume on kernel %s (idmapped tmpfs since 6.3): %v", kernelRelease(), err)
			}
			waitTrue(t, nodeWithin, "the file written to the tmpfs volume", func() (bool, string) {
				_, err := os.Stat(filepath.Join(mem, "written"))
				return err == nil, fmt.Sprint(err)
			})
			if got := fileUID(t, filepath.Join(mem, "written")); got != 0 {
				t.Errorf("tmpfs volume file owned by %d on disk, want 0", got)
			}
		} else {
			if err == nil {
				t.Fatalf("a tmpfs volume of a user-namespaced container started on kernel %s (no idmapped tmpfs before 6.3)", kernelRelease())
			}
			t.Logf("tmpfs volume on kernel %s refused as expected: %v", kernelRelease(), err)
		}
		if cr != nil {
			if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: cr.ContainerId}); err != nil {
				t.Errorf("RemoveContainer of the tmpfs container: %v", err)
			}
		}
	})

	e.removeTraced(ctx, t, p)
	t.Logf("TestNodeUserNamespace (%s driver) took %v", nodeDriver(), time.Since(start).Round(time.Millisecond))
}
