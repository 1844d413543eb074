package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestNodeUpgrade: the package of an older crisp runs pods; `dpkg -i` of this build's
// package restarts the service with the new criserver, which drives the old shims
// (exec, logs, stop, remove) while new pods get the new shim.
func TestNodeUpgrade(t *testing.T) {
	e := newNodeEnv(t)
	oldDeb, newDeb := os.Getenv("CRISP_NODE_OLD_DEB"), os.Getenv("CRISP_NODE_DEB")
	if oldDeb == "" || newDeb == "" {
		t.Skip("CRISP_NODE_OLD_DEB and CRISP_NODE_DEB name the packages to upgrade between (make test-node)")
	}
	oldVersion, newVersion := debField(t, oldDeb, "Version"), debField(t, newDeb, "Version")
	if exec.Command("dpkg", "--compare-versions", oldVersion, "lt", newVersion).Run() != nil {
		t.Fatalf("old package %s is not older than %s", oldVersion, newVersion)
	}
	// Whatever happens, the node ends with this build's package running, with the
	// config the node had, for the tests after this one.
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(e.cfgPath, cfg, 0o644); err != nil {
			t.Errorf("restore %s: %v", e.cfgPath, err)
		}
		dpkgInstall(t, newDeb)
		_ = exec.Command("systemctl", "restart", "crisp.service").Run()
	})
	// The old criserver starts without this one's metadata, as on a node that ran it
	// first (SIGTERM shut this one's warm spare down; no pod runs).
	e.conn.Close()
	e.conn = nil
	systemctl(t, "stop", "crisp.service")
	if err := os.RemoveAll("/var/lib/crisp"); err != nil {
		t.Fatal(err)
	}
	if nodeFlavour() == "selinux" {
		// The node as the old package, which predates SELinux support, left it: no
		// policy module of crisp's, so its shims run unconfined and its pods
		// unlabelled. The upgrade installs the module and relabels crisp's paths
		// under the running pods.
		if out, err := exec.Command("semodule", "-r", "crisp").CombinedOutput(); err != nil {
			t.Fatalf("semodule -r crisp: %v: %s", err, out)
		}
	}
	// A node that ran the old package has the old package's config, which an older
	// criserver must be able to read (this one's may have keys it does not know), with
	// the node's cgroup driver.
	writeOldConfig(t, e.cfgPath, oldDeb, cfg)
	dpkgInstall(t, oldDeb)
	if err := e.connect(2 * time.Minute); err != nil {
		t.Fatalf("old crisp %s does not answer: %v\n%s", oldVersion, err, journal(time.Now().Add(-2*time.Minute)))
	}
	ctx := ctxT(t)
	e.wantVersion(ctx, oldVersion)
	img := e.busybox(ctx)
	kp := e.kubeletPod("upgrade", nil)
	oldPod := e.runPod(ctx, kp.cfg)
	ticker := e.runCtr(ctx, oldPod, kp.cfg, ctrConfig("ticker", img, "sh", "-c", "while true; do echo tick; sleep 0.2; done"))
	sleeper := e.runCtr(ctx, oldPod, kp.cfg, ctrConfig("sleeper", img, "sleep", "3600"))
	_, oldInfo := e.status(ctx, oldPod)
	tickerPid := e.ctrPid(ctx, ticker)

	// The upgrade: the package's postinst restarts the service.
	e.conn.Close()
	e.conn = nil
	dpkgInstall(t, newDeb)
	if err := e.connect(2 * time.Minute); err != nil {
		t.Fatalf("new crisp does not answer after the upgrade: %v", err)
	}
	e.wantVersion(ctx, newVersion)
	st, info := e.status(ctx, oldPod)
	if st.State != cri.PodSandboxState_SANDBOX_READY || info.ShimPid != oldInfo.ShimPid {
		t.Fatalf("after the upgrade the old pod is %v with shim %d (was %d)", st.State, info.ShimPid, oldInfo.ShimPid)
	}
	// The old shim still runs the binary the upgrade replaced.
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", info.ShimPid)); !strings.HasSuffix(exe, " (deleted)") {
		t.Errorf("old shim's binary is %q, want the replaced (deleted) one", exe)
	}
	if got := e.ctrPid(ctx, ticker); got != tickerPid {
		t.Errorf("ticker pid %d after the upgrade, was %d", got, tickerPid)
	}
	if out := e.mustExec(ctx, t, sleeper, "echo", "old shim"); out != "old shim\n" {
		t.Errorf("exec through the old shim: %q", out)
	}
	logPath := filepath.Join(kp.cfg.LogDirectory, "ticker.log")
	before := len(logLines(t, logPath))
	waitFor(t, 30*time.Second, "the ticker's log to grow after the upgrade", func() bool { return len(logLines(t, logPath)) > before+3 })
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: sleeper, Timeout: 2}); err != nil {
		t.Errorf("stop a container of the old shim: %v", err)
	}
	if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: sleeper}); err != nil {
		t.Errorf("remove a container of the old shim: %v", err)
	}

	// A new pod gets the new shim.
	kp2 := e.kubeletPod("upgraded", nil)
	newPod := e.runPod(ctx, kp2.cfg)
	e.runCtr(ctx, newPod, kp2.cfg, ctrConfig("new", img, "sleep", "3600"))
	_, newInfo := e.status(ctx, newPod)
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", newInfo.ShimPid)); exe != "/usr/bin/shim-runc" {
		t.Errorf("new pod's shim runs %q, want the installed /usr/bin/shim-runc", exe)
	}
	e.stopRemove(ctx, t, oldPod)
	e.stopRemove(ctx, t, newPod)
	if err := syscall.Kill(oldInfo.ShimPid, 0); err == nil {
		t.Errorf("old shim %d still runs after its pod was removed", oldInfo.ShimPid)
	}
}

// wantVersion checks the runtime version criserver reports.
func (e *env) wantVersion(ctx context.Context, debVersion string) {
	e.t.Helper()
	v, err := e.rt.Version(ctx, &cri.VersionRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	// The Debian version is the semver one with '-' turned into '~' (hack/deb.sh).
	if got := strings.ReplaceAll(v.RuntimeVersion, "-", "~"); got != debVersion {
		e.t.Errorf("runtime version %s, want the package's %s", v.RuntimeVersion, debVersion)
	}
}

// dpkgInstall installs a package keeping the node's edited /etc/crisp/config.toml.
func dpkgInstall(t *testing.T, deb string) {
	t.Helper()
	cmd := exec.Command("dpkg", "--force-confold", "--force-confdef", "-i", deb)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg -i %s: %v\n%s", deb, err, out)
	}
}

// writeOldConfig writes the config the package oldDeb ships to path, with the
// cgroup_driver line of cur (the node's).
func writeOldConfig(t *testing.T, path, oldDeb string, cur []byte) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", oldDeb, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v: %s", oldDeb, err, out)
	}
	old, err := os.ReadFile(filepath.Join(dir, "etc/crisp/config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	driver := ""
	for _, l := range strings.Split(string(cur), "\n") {
		if strings.HasPrefix(l, "cgroup_driver = ") {
			driver = l
		}
	}
	if driver == "" {
		t.Fatalf("no cgroup_driver line in the node's config:\n%s", cur)
	}
	lines := strings.Split(string(old), "\n")
	found := false
	for i, l := range lines {
		if strings.HasPrefix(l, "cgroup_driver = ") {
			lines[i], found = driver, true
		}
	}
	if !found {
		t.Fatalf("no cgroup_driver line in %s's config", oldDeb)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

// debField reads a control field of a package file.
func debField(t *testing.T, deb, field string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", "-f", deb, field).Output()
	if err != nil {
		t.Fatalf("dpkg-deb -f %s %s: %v", deb, field, err)
	}
	return strings.TrimSpace(string(out))
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
