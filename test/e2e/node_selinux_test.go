package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// seEnv is the installed crisp in the SELinux node VM (enforcing, the reference policy
// with its container module), with enable_selinux on; other node VMs and hosts skip.
func seEnv(t *testing.T) *env {
	t.Helper()
	e := newNodeEnv(t)
	if f := nodeFlavour(); f != "selinux" || !selinux.GetEnabled() {
		t.Skipf("the node VM of flavour %q runs no SELinux", f)
	}
	e.seSetEnabled(true)
	return e
}

// seLabel is a process's SELinux context (/proc/<pid>/attr/current).
func seLabel(t *testing.T, pid int) selinux.Context {
	t.Helper()
	l, err := selinux.PidLabel(pid)
	if err != nil {
		t.Fatalf("label of pid %d: %v", pid, err)
	}
	c, err := selinux.NewContext(l)
	if err != nil {
		t.Fatalf("label %q of pid %d: %v", l, pid, err)
	}
	return c
}

// seExecLabel is what an exec in container id reads as its own label.
func (e *env) seExecLabel(ctx context.Context, id string) selinux.Context {
	e.t.Helper()
	resp, err := e.execSync(ctx, id, 30, "cat", "/proc/self/attr/current")
	if err != nil || resp.ExitCode != 0 {
		e.t.Fatalf("exec cat /proc/self/attr/current in %s: %v %+v", id, err, resp)
	}
	c, err := selinux.NewContext(strings.TrimRight(string(resp.Stdout), "\x00\n"))
	if err != nil {
		e.t.Fatalf("exec label %q: %v", resp.Stdout, err)
	}
	return c
}

// sePod runs a pod with a sleeping container and returns the pod, its container and
// the pod's level as its pause shows it.
func (e *env) sePod(ctx context.Context, name, img string) (podID, ctrID string, pod *cri.PodSandboxConfig, level string) {
	e.t.Helper()
	kp := e.kubeletPod(name, nil)
	podID = e.runPod(ctx, kp.cfg)
	ctrID = e.runCtr(ctx, podID, kp.cfg, ctrConfig("sleeper", img, "sleep", "100000"))
	_, info := e.status(ctx, podID)
	pause := seLabel(e.t, info.Pid)
	ctr := seLabel(e.t, e.ctrPid(ctx, ctrID))
	if ctr["type"] != "container_t" || !strings.Contains(ctr["level"], ":c") {
		e.t.Errorf("container of %s runs as %s, want container_t at a level of its own", name, ctr.Get())
	}
	// The pause takes the pod's label once its namespaces are set up (crisp's policy
	// module lets the shim's domain make that transition): the container's.
	if pause.Get() != ctr.Get() {
		e.t.Errorf("pause of %s runs as %s, its container as %s", name, pause.Get(), ctr.Get())
	}
	return podID, ctrID, kp.cfg, ctr["level"]
}

// TestNodeSELinuxLabels: each pod's pause, containers and execs run as container_t at
// the pod's own level, two pods at distinct levels; a privileged container runs as
// spc_t; a criserver restart keeps the levels, and the next pod gets a new one; logs
// and stats still work.
func TestNodeSELinuxLabels(t *testing.T) {
	e := seEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)

	podA, ctrA, cfgA, levelA := e.sePod(ctx, "selinux-a", img)
	_, ctrB, _, levelB := e.sePod(ctx, "selinux-b", img)
	if levelA == levelB {
		t.Errorf("two pods share level %s", levelA)
	}
	for _, c := range []struct{ id, level string }{{ctrA, levelA}, {ctrB, levelB}} {
		l := seLabel(t, e.ctrPid(ctx, c.id))
		if l["type"] != "container_t" || l["level"] != c.level {
			t.Errorf("container %s runs as %s, want container_t at %s", c.id, l.Get(), c.level)
		}
		if x := e.seExecLabel(ctx, c.id); x.Get() != l.Get() {
			t.Errorf("exec in %s runs as %s, its container as %s", c.id, x.Get(), l.Get())
		}
	}
	t.Logf("pod A %s, pod B %s", levelA, levelB)

	// A privileged container (in a privileged pod): the policy's privileged type.
	kp := e.kubeletPod("selinux-priv", nil)
	kp.cfg.Linux.SecurityContext.Privileged = true
	privPod := e.runPod(ctx, kp.cfg)
	pc := ctrConfig("priv", img, "sleep", "100000")
	pc.Linux.SecurityContext.Privileged = true
	priv := e.runCtr(ctx, privPod, kp.cfg, pc)
	if l := seLabel(t, e.ctrPid(ctx, priv)); l["type"] != "spc_t" {
		t.Errorf("privileged container runs as %s, want spc_t", l.Get())
	}

	// Logs and stats of a labelled container.
	echo := e.runCtr(ctx, podA, cfgA, ctrConfig("echo", img, "sh", "-c", "echo labelled; sleep 100000"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, _ := os.ReadFile(filepath.Join(cfgA.LogDirectory, "echo.log"))
		if strings.Contains(string(data), "labelled") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log of a labelled container: %q", data)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := e.rt.ContainerStats(ctx, &cri.ContainerStatsRequest{ContainerId: echo}); err != nil {
		t.Errorf("ContainerStats: %v", err)
	}

	// A restart keeps every level; the next pod gets a new one.
	e.restartService("restart")
	if l := seLabel(t, e.ctrPid(ctx, ctrA)); l["level"] != levelA {
		t.Errorf("after a restart container A runs at %s, want %s", l["level"], levelA)
	}
	newCtr := e.runCtr(ctx, podA, cfgA, ctrConfig("after", img, "sleep", "100000"))
	if l := seLabel(t, e.ctrPid(ctx, newCtr)); l["level"] != levelA {
		t.Errorf("a container created after the restart runs at %s, its pod at %s", l["level"], levelA)
	}
	_, _, _, levelC := e.sePod(ctx, "selinux-c", img)
	if levelC == levelA || levelC == levelB {
		t.Errorf("the pod started after the restart got level %s, in use by A (%s) or B (%s)", levelC, levelA, levelB)
	}
}

// seHostDir makes a host directory with a file of type typ (chcon), for volumes.
func seHostDir(t *testing.T, typ string) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "crisp-selinux-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("host data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chcon", "-R", "-t", typ, dir).CombinedOutput(); err != nil {
		t.Fatalf("chcon %s %s: %v: %s", typ, dir, err, out)
	}
	return dir
}

// seCat runs cat of path in a container and reports whether it read the file.
func (e *env) seCat(ctx context.Context, id, path string) (bool, string) {
	e.t.Helper()
	resp, err := e.execSync(ctx, id, 30, "cat", path)
	if err != nil {
		e.t.Fatalf("exec cat %s: %v", path, err)
	}
	return resp.ExitCode == 0, string(resp.Stdout) + string(resp.Stderr)
}

// TestNodeSELinuxVolumes: a host file of another label is denied through an
// un-relabelled volume (and the AVC is audited); with selinux_relabel it is read; a
// file pod A wrote in its relabelled directory cannot be read by pod B at another
// level; a relabel of a system directory is refused.
func TestNodeSELinuxVolumes(t *testing.T) {
	e := seEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)
	dir := seHostDir(t, "var_t")
	started := time.Now()

	mountCtr := func(podID string, pod *cri.PodSandboxConfig, name string, relabel bool) (string, error) {
		c := ctrConfig(name, img, "sleep", "100000")
		c.Mounts = []*cri.Mount{{ContainerPath: "/vol", HostPath: dir, SelinuxRelabel: relabel}}
		return e.tryRunCtr(ctx, podID, pod, c)
	}
	podA, _, cfgA, levelA := e.sePod(ctx, "selinux-vol-a", img)
	// The file stays out of the pod's reach: either the policy refuses the bind itself
	// (the reference policy: the engine may not mount on var_t, so the container does
	// not start) or the container starts and its read is denied (Fedora's policy).
	if plain, err := mountCtr(podA, cfgA, "plain", false); err != nil {
		if !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("container with an un-relabelled var_t volume: %v", err)
		}
		if avcs := avcsSince(t, started, "tcontext=system_u:object_r:var_t:s0"); len(avcs) == 0 {
			t.Errorf("the un-relabelled volume was refused without an AVC denial naming var_t: %v", err)
		}
		t.Logf("un-relabelled var_t volume: the container does not start: %v", err)
	} else {
		if ok, out := e.seCat(ctx, plain, "/vol/secret"); ok {
			t.Errorf("read a var_t file through an un-relabelled volume: %q", out)
		}
		if avcs := avcsSince(t, started, "scontext=system_u:system_r:container_t:"+levelA); len(avcs) == 0 {
			t.Errorf("no AVC denial of container_t:%s in the audit log since %s", levelA, started.Format(time.RFC3339))
		}
	}

	relabelled, err := mountCtr(podA, cfgA, "relabelled", true)
	if err != nil {
		t.Fatalf("container with a relabelled volume: %v", err)
	}
	if ok, out := e.seCat(ctx, relabelled, "/vol/secret"); !ok || !strings.Contains(out, "host data") {
		t.Errorf("relabelled volume not readable: %q", out)
	}
	if l, err := selinux.FileLabel(filepath.Join(dir, "secret")); err != nil || !strings.HasSuffix(l, ":container_file_t:"+levelA) {
		t.Errorf("relabelled file is %q (%v), want container_file_t at %s", l, err, levelA)
	}
	if resp, err := e.execSync(ctx, relabelled, 30, "sh", "-c", "echo from A > /vol/a"); err != nil || resp.ExitCode != 0 {
		t.Fatalf("pod A writes its volume: %v %+v", err, resp)
	}

	podB, _, cfgB, _ := e.sePod(ctx, "selinux-vol-b", img)
	c := ctrConfig("reader", img, "sleep", "100000")
	c.Mounts = []*cri.Mount{{ContainerPath: "/vol", HostPath: dir}}
	reader := e.runCtr(ctx, podB, cfgB, c)
	if ok, out := e.seCat(ctx, reader, "/vol/a"); ok {
		t.Errorf("pod B read pod A's file: %q", out)
	}

	sys := ctrConfig("sys", img, "true")
	sys.Mounts = []*cri.Mount{{ContainerPath: "/host-etc", HostPath: "/etc", SelinuxRelabel: true, Readonly: true}}
	_, err = e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podB, Config: sys, SandboxConfig: cfgB})
	if err == nil || !strings.Contains(err.Error(), "cannot be relabelled") {
		t.Errorf("relabel of /etc: %v", err)
	}
}

// TestNodeSELinuxCost measures the pod start cost of labelling: the same pod cycle
// (run a pod, a container, remove) with enable_selinux on and off.
func TestNodeSELinuxCost(t *testing.T) {
	e := seEnv(t)
	ctx := ctxT(t)
	img := e.busybox(ctx)
	cycle := func(name string) time.Duration {
		// A deadline per round, not one for the whole test: with three guests on this
		// host's two cores a round of 5 cycles has taken over a minute.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		const n = 5
		var total time.Duration
		for i := range n {
			kp := e.kubeletPod(name+string(rune('a'+i)), nil)
			start := time.Now()
			podID := e.runPod(ctx, kp.cfg)
			e.runCtr(ctx, podID, kp.cfg, ctrConfig("c", img, "true"))
			total += time.Since(start)
			if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
				t.Fatal(err)
			}
		}
		return total / n
	}
	cycle("warm")
	on := cycle("on")
	e.seSetEnabled(false)
	off := cycle("off")
	t.Logf("pod and container start, mean of 5: enable_selinux on %v, off %v (%+.1f%%)", on, off, 100*(float64(on)/float64(off)-1))
}

// seSetEnabled sets enable_selinux in the installed config and restarts the service;
// the config as it was comes back, with a restart, when the test ends.
func (e *env) seSetEnabled(on bool) {
	e.t.Helper()
	e.editNodeConfig(func(cfg map[string]any) { cfg["enable_selinux"] = on })
}

// tryRunCtr creates and starts a container and returns the error of whichever step
// failed (a container that failed to start is removed).
func (e *env) tryRunCtr(ctx context.Context, podID string, pod *cri.PodSandboxConfig, cfg *cri.ContainerConfig) (string, error) {
	e.t.Helper()
	resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return "", err
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		_, _ = e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId})
		return "", err
	}
	return resp.ContainerId, nil
}
