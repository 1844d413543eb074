// The file is not node_wasm_test.go: a _wasm suffix makes Go build it for GOARCH=wasm only.

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/selinux/go-selinux"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	// The first container compiles the module: a minute or more in the TCG guest.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	compat, artifact := e.pullWasmImages(ctx, t, module)

	kp := e.kubeletPod("wasm", nil)
	resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: kp.cfg, RuntimeHandler: wasmHandler})
	if err != nil {
		t.Fatalf("RunPodSandbox on the package's %s handler: %v", wasmHandler, err)
	}
	podID, pod := resp.PodSandboxId, kp.cfg

	// One after another: the first compiles the module into the node's cache, which
	// the others (the same module) load from. Each module sleeps before it ends.
	limited := wasmCtr("limited", compat, nil, "sleep=1s", "hog=64")
	limited.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	cases := []struct {
		cfg        *cri.ContainerConfig
		code       int32
		reason     string
		wantStdout string
	}{
		{wasmCtr("oci", compat, nil, "read=/etc/motd", "sleep=1s", "exit=3"), 3, "Error", "read /etc/motd: message of the day"},
		{wasmCtr("artifact", artifact, []string{"NAME", "artifact"}, "sleep=1s"), 0, "Completed", "NAME=artifact"},
		{limited, 137, "OOMKilled", "woke up"},
	}
	var ids []string
	for _, c := range cases {
		name := c.cfg.Metadata.Name
		id, logPath := e.runWasmCtr(ctx, podID, pod, c.cfg)
		ids = append(ids, id)
		// Its process is there from CreateContainer on, in the container's cgroup.
		runs := wasmRunsIn(e.wasmProcsOf("/usr/bin/shim-wasm"), id)
		if len(runs) != 1 {
			t.Errorf("%s: `shim-wasm _run` processes %v, want one", name, runs)
		}
		want := kp.cgroup + "/crisp-" + id
		if nodeDriver() == "systemd" {
			want += ".scope"
		}
		for pid := range runs {
			if cg := procCgroup(t, pid); cg != want {
				t.Errorf("%s: the module's process %d is in cgroup %s, want %s (the %s driver's)", name, pid, cg, want, nodeDriver())
			}
		}
		begun := time.Now()
		cs := e.waitExit(ctx, id, 8*time.Minute)
		if cs.ExitCode != c.code || cs.Reason != c.reason {
			t.Errorf("%s exited %d (%q), want %d (%s)", name, cs.ExitCode, cs.Reason, c.code, c.reason)
		}
		stdout, stderr := logStreams(waitLogLine(t, logPath, "stdout "+c.wantStdout, 30*time.Second))
		if !slices.Contains(stderr, "hello from stderr") {
			t.Errorf("%s: stderr %q lacks the module's line", name, stderr)
		}
		if c.code == 137 && slices.Contains(stdout, "allocated 64 MiB") {
			t.Errorf("%s: allocated 64 MiB under a 32 MiB limit: %q", name, stdout)
		}
		t.Logf("%s: exit %d (%s) %v after its start", name, cs.ExitCode, cs.Reason, time.Since(begun).Round(time.Millisecond))
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
