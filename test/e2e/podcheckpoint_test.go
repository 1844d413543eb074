package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

const countScript = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.2; done"

// counterConfig is a container that logs 0, 1, 2, … five times a second, in its own
// PID namespace (what CRIU needs).
func counterConfig(name, image string) *cri.ContainerConfig {
	cfg := ctrConfig(name, image, "sh", "-c", countScript)
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Pid: cri.NamespaceMode_CONTAINER}
	return cfg
}

// dirEntries lists a directory's names (nil when it is empty or missing).
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestE2ECheckpointPod checkpoints a pod of two counting containers with
// CheckpointPod (after its refusals), removes the pod, restores it with RestorePod
// (after its refusals) and starts both containers: each resumes its count where the
// checkpoint cut it.
func TestE2ECheckpointPod(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	needCRIU(t)
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	ref := e.busybox(ctx)

	pod := e.podConfig("podckpt-src")
	podID := e.runPod(ctx, pod)
	names := []string{"alpha", "beta"}
	ids := map[string]string{}
	logs := map[string]string{}
	for _, n := range names {
		cfg := counterConfig(n, ref)
		ids[n] = e.runCtr(ctx, podID, pod, cfg)
		logs[n] = filepath.Join(pod.LogDirectory, cfg.LogPath)
	}
	done := e.runCtr(ctx, podID, pod, ctrConfig("done", ref, "true"))
	e.waitExit(ctx, done, 10*time.Second)
	other := e.podConfig("podckpt-other")
	otherID := e.runPod(ctx, other)
	foreign := e.runCtr(ctx, otherID, other, counterConfig("foreign", ref))
	for _, n := range names {
		waitCount(t, logs[n], 3, 20*time.Second)
	}

	// Refusals: each writes nothing.
	out := t.TempDir()
	both := []string{ids["alpha"], ids["beta"]}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	checkpoint := func(pod, path string, ctrs []string, opts map[string]string) error {
		_, err := e.rt.CheckpointPod(cctx, &cri.CheckpointPodRequest{PodSandboxId: pod, OutputPath: path, ContainerIds: ctrs, Options: opts})
		return err
	}
	wantCode(t, "unknown pod", checkpoint("nosuchpod", out, both, nil), codes.NotFound)
	wantCode(t, "relative output path", checkpoint(podID, "ckpt", both, nil), codes.InvalidArgument)
	wantCode(t, "missing output dir", checkpoint(podID, filepath.Join(out, "missing"), both, nil), codes.InvalidArgument)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "output path is a file", checkpoint(podID, file, both, nil), codes.InvalidArgument)
	wantCode(t, "non-empty output dir", checkpoint(podID, filepath.Dir(file), both, nil), codes.FailedPrecondition)
	wantCode(t, "no containers", checkpoint(podID, out, nil, nil), codes.InvalidArgument)
	wantCode(t, "duplicate container", checkpoint(podID, out, []string{ids["alpha"], ids["alpha"]}, nil), codes.InvalidArgument)
	wantCode(t, "unknown container", checkpoint(podID, out, []string{ids["alpha"], "nosuchcontainer"}, nil), codes.NotFound)
	wantCode(t, "container of another pod", checkpoint(podID, out, []string{ids["alpha"], foreign}, nil), codes.InvalidArgument)
	wantCode(t, "exited container", checkpoint(podID, out, []string{ids["alpha"], done}, nil), codes.FailedPrecondition)
	wantCode(t, "unknown option", checkpoint(podID, out, both, map[string]string{"tcp-established": "true"}), codes.InvalidArgument)
	if left := dirEntries(t, out); len(left) > 0 {
		t.Fatalf("refused pod checkpoints wrote %v", left)
	}
	for _, n := range names {
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ids[n]})
		if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("%s after refused checkpoints: %v %v", n, err, st.GetStatus().GetState())
		}
	}

	// The checkpoint.
	last := map[string]int{}
	for _, n := range names {
		c := counts(t, logs[n])
		last[n] = c[len(c)-1]
	}
	start := time.Now()
	if err := checkpoint(podID, out, both, nil); err != nil {
		t.Fatalf("CheckpointPod: %v\n%s\nshim logs:\n%s", err, e.log(), e.shimLogs())
	}
	checkpointTime := time.Since(start)
	var size int64
	for _, f := range dirEntries(t, out) {
		fi, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if got := dirEntries(t, out); len(got) != 3 {
		t.Errorf("pod checkpoint holds %v; want pod.json and two archives", got)
	}
	t.Logf("pod checkpoint of 2 containers: %v, %d bytes; %s", checkpointTime, size, logLinesWith(e.log(), `"msg":"pod checkpointed"`))
	// Both resumed: running, and counting on.
	for _, n := range names {
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ids[n]})
		if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("%s after the checkpoint: %v %v", n, err, st.GetStatus().GetState())
		}
		waitCount(t, logs[n], len(counts(t, logs[n]))+1, 10*time.Second)
	}
	// The foreign container was never touched and counts on as well.
	waitCount(t, filepath.Join(other.LogDirectory, "foreign.log"), 3, 10*time.Second)

	// The pod goes away.
	for _, p := range []string{podID, otherID} {
		if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}

	// RestorePod's refusals leave no pod behind.
	dst := e.podConfig("podckpt-dst")
	restore := func(path string, cfgs []*cri.ContainerConfig, opts map[string]string) (*cri.RestorePodResponse, error) {
		return e.rt.RestorePod(cctx, &cri.RestorePodRequest{CheckpointPath: path, Config: dst, ContainerConfigs: cfgs, Options: opts})
	}
	cfgs := []*cri.ContainerConfig{counterConfig("beta", ref), counterConfig("alpha", ref)}
	_, err := restore(out, cfgs, map[string]string{"x": "y"})
	wantCode(t, "restore with an unknown option", err, codes.InvalidArgument)
	_, err = restore("relative", cfgs, nil)
	wantCode(t, "relative checkpoint path", err, codes.InvalidArgument)
	_, err = restore(t.TempDir(), cfgs, nil)
	wantCode(t, "directory without a pod checkpoint", err, codes.InvalidArgument)
	_, err = restore(out, cfgs[:1], nil)
	wantCode(t, "a container config missing", err, codes.InvalidArgument)
	_, err = restore(out, append(cfgs, counterConfig("gamma", ref)), nil)
	wantCode(t, "a container config too many", err, codes.InvalidArgument)
	bad := counterConfig("alpha", ref)
	bad.Command = []string{"sh", "-c", "echo other"}
	_, err = restore(out, []*cri.ContainerConfig{cfgs[0], bad}, nil)
	wantCode(t, "a different command", err, codes.InvalidArgument)
	_, err = e.rt.RestorePod(cctx, &cri.RestorePodRequest{CheckpointPath: out, Config: dst, ContainerConfigs: cfgs, RuntimeHandler: "nosuchhandler"})
	wantCode(t, "unknown runtime handler", err, codes.InvalidArgument)
	if pods, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err != nil || len(pods.Items) != 0 {
		t.Fatalf("refused restores left pods: %v %v", err, pods.GetItems())
	}

	// The restore: a new pod, both containers created and not running.
	start = time.Now()
	resp, err := restore(out, cfgs, nil)
	if err != nil {
		t.Fatalf("RestorePod: %v\n%s\nshim logs:\n%s", err, e.log(), e.shimLogs())
	}
	restoreTime := time.Since(start)
	if resp.PodSandboxId == "" || len(resp.RestoredContainers) != 2 || resp.RestoredContainers[0].Name != "beta" || resp.RestoredContainers[1].Name != "alpha" {
		t.Fatalf("RestorePod response %v: want the pod and beta, alpha in the request's order", resp)
	}
	if ps, _ := e.status(ctx, resp.PodSandboxId); ps.State != cri.PodSandboxState_SANDBOX_READY || ps.Metadata.Name != "podckpt-dst" {
		t.Fatalf("restored pod: %v %v", ps.State, ps.Metadata)
	}
	newLogs := map[string]string{}
	for _, rc := range resp.RestoredContainers {
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: rc.ContainerId})
		if err != nil || st.Status.State != cri.ContainerState_CONTAINER_CREATED || st.Status.Metadata.Name != rc.Name {
			t.Fatalf("restored %s before start: %v %v", rc.Name, err, st.GetStatus())
		}
		newLogs[rc.Name] = filepath.Join(dst.LogDirectory, rc.Name+".log")
	}
	// Created means not run: nothing is counted yet.
	time.Sleep(500 * time.Millisecond)
	for n, l := range newLogs {
		if data, err := os.ReadFile(l); err == nil && len(data) > 0 {
			t.Errorf("restored %s logged before StartContainer: %q", n, data)
		}
	}
	start = time.Now()
	for _, rc := range resp.RestoredContainers {
		if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: rc.ContainerId}); err != nil {
			t.Fatalf("StartContainer %s: %v\n%s\nshim logs:\n%s", rc.Name, err, e.log(), e.shimLogs())
		}
	}
	startTime := time.Since(start)
	for _, n := range names {
		after := waitCount(t, newLogs[n], 3, 20*time.Second)
		t.Logf("%s: last count before the checkpoint %d, after the restore %v", n, last[n], after[:4])
		if after[0] < last[n] || after[0] > last[n]+int(checkpointTime/(200*time.Millisecond))+10 {
			t.Errorf("%s resumed at %d; the checkpoint was taken after %d", n, after[0], last[n])
		}
		for i := 1; i < len(after); i++ {
			if after[i] != after[i-1]+1 {
				t.Fatalf("%s: counts after the restore not consecutive: %v", n, after)
			}
		}
	}
	// One cut: both were paused before either was dumped, so each resumes as far past
	// its last count before the call as the other (±1 for their start offsets), though
	// the second dump ran half a second after the first.
	gap := func(n string) int { return counts(t, newLogs[n])[0] - last[n] }
	if d := gap("alpha") - gap("beta"); d < -1 || d > 1 {
		t.Errorf("not one cut: alpha resumed %d counts past its last, beta %d", gap("alpha"), gap("beta"))
	}
	t.Logf("RestorePod %v, StartContainer x2 %v", restoreTime, startTime)
	if left := dirEntries(t, out); len(left) != 3 {
		t.Errorf("the restore changed the checkpoint directory: %v", left)
	}

	// Removing the restored pod removes everything.
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.state, "restore-*")); len(left) > 0 {
		t.Errorf("unpacked archives left: %v", left)
	}
}
