// The file is not node_wasm_test.go: a _wasm suffix makes Go build it for GOARCH=wasm only.

package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// TestNodeWasm runs WebAssembly pods on the installed package's own "wasm" handler
// (its /etc/crisp/config.toml, unedited but for the cgroup driver) under systemd with
// cgroup v2 and the node's LSM: a module from each image form with its log and exit
// code, one over its memory limit (137, OOMKilled), each module's process in its
// container's cgroup below the pod's kubelet-made cgroup, made the driver's way; and
// under SELinux no denial for crisp's binaries.
func TestNodeWasm(t *testing.T) {
	e := newNodeEnv(t)
	module := wasmModule(t)
	started := time.Now()
	ctx := ctxT(t)
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "hello-wasm:compat", wasmCompatImage(t, module))
	pushWasmArtifact(t, host, "hello-wasm:artifact", module)
	compat, artifact := host+"/hello-wasm:compat", host+"/hello-wasm:artifact"
	for _, ref := range []string{compat, artifact} {
		if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("PullImage %s: %v", ref, err)
		}
	}

	kp := e.kubeletPod("wasm", nil)
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: kp.cfg, RuntimeHandler: wasmHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox on the package's %s handler: %v", wasmHandler, err)
	}
	podID, pod := resp.PodSandboxId, kp.cfg

	// Each module sleeps first, so that its process can be looked at, then exits.
	limited := wasmCtr("limited", compat, nil, "sleep=3s", "hog=64")
	limited.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	cases := []struct {
		cfg        *cri.ContainerConfig
		code       int32
		reason     string
		lastStdout string
	}{
		{wasmCtr("oci", compat, nil, "read=/etc/motd", "sleep=3s", "exit=3"), 3, "Error", "woke up"},
		{wasmCtr("artifact", artifact, []string{"NAME", "artifact"}, "sleep=3s"), 0, "Completed", "woke up"},
		{limited, 137, "OOMKilled", "woke up"},
	}
	ids := make([]string, len(cases))
	logs := make([]string, len(cases))
	for i, c := range cases {
		ids[i], logs[i] = e.runWasmCtr(ctx, podID, pod, c.cfg)
	}
	runs := wasmRunsIn(e.wasmProcsOf("/usr/bin/shim-wasm"), ids...)
	for i, id := range ids {
		var pid int
		for p, cmd := range runs {
			if strings.Contains(cmd, id) {
				pid = p
			}
		}
		if pid == 0 {
			t.Errorf("%s: no `shim-wasm _run` process (running: %v)", cases[i].cfg.Metadata.Name, runs)
			continue
		}
		cg := procCgroup(t, pid)
		want := kp.cgroup + "/crisp-" + id + ".scope"
		if nodeDriver() != "systemd" {
			want = kp.cgroup + "/" + id
		}
		if cg != want {
			t.Errorf("%s: the module's process %d is in cgroup %s, want %s (the %s driver's)", cases[i].cfg.Metadata.Name, pid, cg, want, nodeDriver())
		}
	}
	for i, c := range cases {
		name := c.cfg.Metadata.Name
		cs := e.waitExit(ctx, ids[i], 4*time.Minute) // the first compiles the module: ~1 min in the TCG guest
		if cs.ExitCode != c.code || cs.Reason != c.reason {
			t.Errorf("%s exited %d (%q), want %d (%s)", name, cs.ExitCode, cs.Reason, c.code, c.reason)
		}
		stdout, stderr := logStreams(waitLogLine(t, logs[i], "stdout "+c.lastStdout, 30*time.Second))
		if !slices.Contains(stderr, "hello from stderr") {
			t.Errorf("%s: stderr %q lacks the module's line", name, stderr)
		}
		t.Logf("%s: exit %d (%s), %d stdout lines", name, cs.ExitCode, cs.Reason, len(stdout))
	}
	if stdout, _ := logStreams(readLogIfAny(t, logs[0])); !slices.Contains(stdout, "read /etc/motd: message of the day") {
		t.Errorf("oci: stdout %q lacks the rootfs file's line", stdout)
	}
	if stdout, _ := logStreams(readLogIfAny(t, logs[2])); slices.Contains(stdout, "allocated 64 MiB") {
		t.Errorf("limited: allocated 64 MiB under a 32 MiB limit: %q", stdout)
	}

	if err := stopRemovePod(ctx, e.rt, podID); err != nil {
		t.Fatal(err)
	}
	if left := wasmRunsIn(e.wasmProcsOf("/usr/bin/shim-wasm"), ids...); len(left) > 0 {
		t.Errorf("module processes left after the pod's removal: %v", left)
	}
	if selinux.GetEnabled() {
		for _, avc := range avcsSince(t, started, crispExes...) {
			t.Errorf("AVC denial during the wasm pod: %s", avc)
		}
	}
}
