package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/testutil"
)

// needCRIU skips when CRIU cannot work here, saying why: when `criu check` fails, and
// when a plain dump of a sleeping process does not finish. The dump runs as the shim
// runs CRIU, with CRIU_FAULT=130 (no hardware breakpoints: VMs such as Firecracker give
// ptrace none, and without it every dump hangs after the parasite's exit), so the probe
// says whether crisp's own dumps can work, and cannot turn the test into a timeout.
func needCRIU(t *testing.T) {
	t.Helper()
	out, err := exec.Command("criu", "check").CombinedOutput()
	if err != nil {
		t.Skipf("criu check failed (install CRIU >= 4 with hack/criu.sh): %v: %s", err, bytes.TrimSpace(out))
	}
	sleeper := exec.Command("sleep", "60")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	probe := exec.CommandContext(ctx, "criu", "dump", "--leave-running", "-t", strconv.Itoa(sleeper.Process.Pid), "-D", dir, "-o", "dump.log", "-v4")
	probe.Env = append(os.Environ(), "CRIU_FAULT=130")
	if out, err := probe.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		lines := strings.Split(strings.TrimSpace(string(log)), "\n")
		t.Skipf("criu check passes but CRIU (with CRIU_FAULT=130, as the shim runs it) cannot dump a sleeping process here (kernel %s): %v %s; dump.log ends %q",
			kernelRelease(), err, bytes.TrimSpace(out), lines[max(0, len(lines)-3):])
	}
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return "?"
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// counts returns the numbers a counting container logged, in order.
func counts(t *testing.T, path string) []int {
	t.Helper()
	var out []int
	for _, l := range logLines(t, path) {
		n, err := strconv.Atoi(strings.TrimPrefix(l, "stdout "))
		if err != nil {
			t.Fatalf("log line %q is not a count", l)
		}
		out = append(out, n)
	}
	return out
}

// waitCount waits until the container's log holds more than n numbers.
func waitCount(t *testing.T, path string, n int, within time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(path); err == nil {
			if c := counts(t, path); len(c) > n {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %s did not reach %d lines within %v", path, n+1, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// archiveEntries lists the names in a tar file.
func archiveEntries(t *testing.T, path string) map[string]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read archive %s: %v", path, err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = h.Size
	}
}

// shimLogs returns the logs of every shim of the env.
func (e *env) shimLogs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(e.state, "sandboxes", "*", "shim.log"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.WriteString("== " + f + "\n")
		b.Write(data)
	}
	return b.String()
}

// logLinesWith returns the lines of logs that contain any of the needles.
func logLinesWith(logs string, needles ...string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		for _, n := range needles {
			if strings.Contains(l, n) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: got %v, want %v", what, err, code)
	}
}

func TestE2ECheckpointRestore(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	needCRIU(t)
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	ref := e.busybox(ctx)

	pod1 := e.podConfig("ckpt-src")
	pod1ID := e.runPod(ctx, pod1)
	cfg := ctrConfig("counter", ref, "sh", "-c", "i=0; while :; do echo $i; i=$((i+1)); sleep 0.2; done")
	// CRIU dumps a process tree from the root of its PID namespace: kubelet's default
	// (no shareProcessNamespace) is the container's own.
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Pid: cri.NamespaceMode_CONTAINER}
	id := e.runCtr(ctx, pod1ID, pod1, cfg)
	srcLog := filepath.Join(pod1.LogDirectory, cfg.LogPath)
	waitCount(t, srcLog, 5, 20*time.Second)

	// Changes of the writable layer travel in the archive: a new file and a deleted
	// file of the image.
	if r, err := e.execSync(ctx, id, 10, "sh", "-c", "echo kept > /marker && rm /bin/ls && test ! -e /bin/ls"); err != nil || r.ExitCode != 0 {
		t.Fatalf("prepare rootfs changes: %v %+v", err, r)
	}

	dir := t.TempDir()
	archivePath := filepath.Join(dir, "counter.tar")

	// Bad requests.
	_, err := e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: "nosuchcontainer", Location: archivePath})
	wantCode(t, "unknown container", err, codes.NotFound)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: "counter.tar"})
	wantCode(t, "relative location", err, codes.InvalidArgument)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "missing", "c.tar")})
	wantCode(t, "location in a missing directory", err, codes.InvalidArgument)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: dir})
	wantCode(t, "location is a directory", err, codes.InvalidArgument)

	// The checkpoint; the container keeps running.
	before := counts(t, srcLog)
	lastBefore := before[len(before)-1]
	start := time.Now()
	if _, err := e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: archivePath, Timeout: 30}); err != nil {
		t.Fatalf("CheckpointContainer: %v\n%s\nshim logs:\n%s", err, e.log(), e.shimLogs())
	}
	checkpointTime := time.Since(start)
	fi, err := os.Stat(archivePath)
	if err != nil {
		t.Fatal(err)
	}
	entries := archiveEntries(t, archivePath)
	for _, want := range []string{"checkpoint/inventory.img", "checkpoint/descriptors.json", "config.dump", "spec.dump", "status.dump", "rootfs-diff.tar", "deleted.files", "container-config.dump", "dump.log"} {
		if _, ok := entries[want]; !ok {
			t.Errorf("archive lacks %s; has %v", want, entries)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".counter.tar.tmp-*")); len(left) > 0 {
		t.Errorf("temporary archive files left: %v", left)
	}
	st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil || st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container after checkpoint: %v %v", err, st.GetStatus().GetState())
	}
	srcImageRef := st.Status.ImageRef
	waitCount(t, srcLog, len(counts(t, srcLog))+1, 10*time.Second)
	t.Logf("checkpoint: %v, archive %d bytes (%d entries), last count before: %d", checkpointTime, fi.Size(), len(entries), lastBefore)

	// The original goes away.
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "stopped.tar")})
	wantCode(t, "stopped container", err, codes.FailedPrecondition)
	if _, err := os.Stat(filepath.Join(dir, "stopped.tar")); err == nil {
		t.Error("a refused checkpoint wrote an archive")
	}
	if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}

	// Archives that cannot be restored.
	pod2 := e.podConfig("ckpt-dst")
	pod2ID := e.runPod(ctx, pod2)
	create := func(name, image string) (string, error) {
		c := ctrConfig(name, image)
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod2ID, Config: c, SandboxConfig: pod2})
		return resp.GetContainerId(), err
	}
	garbage := filepath.Join(dir, "garbage.tar")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a tar archive "), 100), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = create("garbage", garbage)
	wantCode(t, "garbage archive", err, codes.InvalidArgument)
	_, err = create("missing", filepath.Join(dir, "nosuch.tar"))
	wantCode(t, "missing archive", err, codes.InvalidArgument)
	// A tar that tries to write outside the directory it is unpacked in.
	escape := filepath.Join(dir, "escape.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	outside := filepath.Join(os.TempDir(), "crisp-ckpt-escape-"+strconv.Itoa(os.Getpid()))
	for _, h := range []*tar.Header{
		{Name: "../../../../../../.." + outside, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg},
		{Name: "config.dump", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			_, _ = tw.Write([]byte("bad"))
		}
	}
	_ = tw.Close()
	if err := os.WriteFile(escape, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = create("escape", escape)
	wantCode(t, "archive with escaping entries", err, codes.InvalidArgument)
	if _, err := os.Stat(outside); err == nil {
		os.Remove(outside)
		t.Errorf("an archive entry was written outside: %s", outside)
	}
	if left, _ := filepath.Glob(filepath.Join(e.state, "restore-*")); len(left) > 0 {
		t.Errorf("unpacked archives left: %v", left)
	}

	// The restore, into another pod.
	rcfg := ctrConfig("counter-restored", archivePath)
	start = time.Now()
	resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod2ID, Config: rcfg, SandboxConfig: pod2})
	if err != nil {
		t.Fatalf("CreateContainer from the archive: %v\n%s", err, e.log())
	}
	rid := resp.ContainerId
	created := time.Since(start)
	st, err = e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: rid})
	if err != nil || st.Status.State != cri.ContainerState_CONTAINER_CREATED {
		t.Fatalf("restored container before start: %v %v", err, st.GetStatus().GetState())
	}
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: rid}); err != nil {
		t.Fatalf("StartContainer of the restored container: %v\n%s\nshim logs:\n%s", err, e.log(), e.shimLogs())
	}
	restoreTime := time.Since(start)
	dstLog := filepath.Join(pod2.LogDirectory, rcfg.LogPath)
	after := waitCount(t, dstLog, 5, 20*time.Second)
	t.Logf("restore: create %v, create+start %v; counts after restore: %v", created, restoreTime, after[:6])
	// Where the time went: CRIU's share as the server and the shims log it.
	t.Logf("timings:\n%s", logLinesWith(e.log()+e.shimLogs(), `"msg":"container checkpointed"`, `"msg":"container restored"`))

	first := after[0]
	if first == 0 || first < lastBefore-2 {
		t.Errorf("restored count starts at %d; the last count before the checkpoint was %d", first, lastBefore)
	}
	// Leave-running dumps take well under the time the count would need to get far.
	if first > lastBefore+int(checkpointTime/(200*time.Millisecond))+10 {
		t.Errorf("restored count starts at %d, far beyond %d at the checkpoint", first, lastBefore)
	}
	for i := 1; i < len(after); i++ {
		if after[i] != after[i-1]+1 {
			t.Fatalf("restored counts not consecutive: %v", after)
		}
	}

	// Status: running, the original image.
	st, err = e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: rid, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		t.Errorf("restored container state %v", st.Status.State)
	}
	if st.Status.Image.GetUserSpecifiedImage() != ref || st.Status.ImageRef != srcImageRef || st.Status.Metadata.GetName() != "counter-restored" {
		t.Errorf("restored status: image %q (%q), ref %q (want %q), name %q", st.Status.Image.GetUserSpecifiedImage(), st.Status.Image.GetImage(), st.Status.ImageRef, srcImageRef, st.Status.Metadata.GetName())
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.Pid == 0 {
		t.Fatalf("verbose info: %v %q", err, st.Info["info"])
	}
	// In the new pod's network namespace and the new container's cgroup.
	_, podInfo := e.status(ctx, pod2ID)
	if got, want := nsInode(t, filepath.Join("/proc", strconv.Itoa(info.Pid), "ns/net")), nsInode(t, filepath.Join("/proc", strconv.Itoa(podInfo.Pid), "ns/net")); got != want {
		t.Errorf("restored process in netns %d, pod's is %d", got, want)
	}
	cg, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(info.Pid), "cgroup"))
	if err != nil || !strings.Contains(string(cg), rid) || strings.Contains(string(cg), id) {
		t.Errorf("restored process cgroups (want %s, not %s): %v\n%s", rid, id, err, cg)
	}

	// The rootfs changes came along.
	r, err := e.execSync(ctx, rid, 10, "sh", "-c", "cat /marker; test ! -e /bin/ls && echo gone")
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "kept\ngone\n" {
		t.Errorf("rootfs of the restored container: %v %q %q", err, r.GetStdout(), r.GetStderr())
	}

	// A second restore of the same archive into the same pod works too.
	rcfg2 := ctrConfig("counter-again", archivePath)
	rid2 := e.runCtr(ctx, pod2ID, pod2, rcfg2)
	again := waitCount(t, filepath.Join(pod2.LogDirectory, rcfg2.LogPath), 2, 20*time.Second)
	if again[0] != first {
		t.Errorf("second restore starts at %d, first at %d", again[0], first)
	}

	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, c := range []string{rid, rid2} {
		if _, err := e.rt.StopContainer(stopCtx, &cri.StopContainerRequest{ContainerId: c, Timeout: 0}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.rt.RemoveContainer(stopCtx, &cri.RemoveContainerRequest{ContainerId: c}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{pod1ID, pod2ID} {
		if _, err := e.rt.RemovePodSandbox(stopCtx, &cri.RemovePodSandboxRequest{PodSandboxId: p}); err != nil {
			t.Fatal(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(e.root, "checkpoints", "*")); len(left) > 0 {
		t.Errorf("checkpoint staging dirs left: %v", left)
	}
}

// TestE2ECheckpointErrors checks the refusals, which need no working CRIU.
func TestE2ECheckpointErrors(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	ref := e.busybox(ctx)
	pod := e.podConfig("ckpt-err")
	podID := e.runPod(ctx, pod)
	cfg := ctrConfig("done", ref, "true")
	id := e.runCtr(ctx, podID, pod, cfg)
	e.waitExit(ctx, id, 10*time.Second)
	dir := t.TempDir()

	_, err := e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: "nosuchcontainer", Location: filepath.Join(dir, "a.tar")})
	wantCode(t, "unknown container", err, codes.NotFound)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: "a.tar"})
	wantCode(t, "relative location", err, codes.InvalidArgument)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "missing", "a.tar")})
	wantCode(t, "location in a missing directory", err, codes.InvalidArgument)
	_, err = e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "a.tar")})
	wantCode(t, "exited container", err, codes.FailedPrecondition)
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("refused checkpoints wrote %v", entries)
	}

	create := func(name, image string) error {
		_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig(name, image), SandboxConfig: pod})
		return err
	}
	garbage := filepath.Join(dir, "garbage.tar")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a tar archive "), 100), 0o600); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "garbage archive", create("garbage", garbage), codes.InvalidArgument)
	wantCode(t, "missing archive", create("missing", filepath.Join(dir, "nosuch.tar")), codes.InvalidArgument)

	// A tar that is no checkpoint, and one whose entries try to leave the directory
	// it is unpacked in.
	outside := filepath.Join(os.TempDir(), "crisp-ckpt-escape-"+strconv.Itoa(os.Getpid()))
	for name, hdrs := range map[string][]*tar.Header{
		"plain.tar": {{Name: "hello.txt", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg}},
		"escape.tar": {
			{Name: "../../../../../../.." + outside, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg},
			{Name: "config.dump", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"},
			{Name: "spec.dump", Typeflag: tar.TypeLink, Linkname: "../../../../../../etc/shadow"},
		},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if h.Size > 0 {
				_, _ = tw.Write([]byte("bad"))
			}
		}
		_ = tw.Close()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		wantCode(t, name, create(strings.TrimSuffix(name, ".tar"), path), codes.InvalidArgument)
	}
	if _, err := os.Stat(outside); err == nil {
		os.Remove(outside)
		t.Errorf("an archive entry was written outside: %s", outside)
	}
	if left, _ := filepath.Glob(filepath.Join(e.state, "restore-*")); len(left) > 0 {
		t.Errorf("unpacked archives left: %v", left)
	}
	resp, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{})
	if err != nil || len(resp.Containers) != 1 {
		t.Errorf("refused creates left containers: %v %v", err, resp.GetContainers())
	}
}

// TestE2ECheckpointDeadline checks that the request's timeout bounds a checkpoint:
// either it finishes in time, or the call fails with DeadlineExceeded, writes nothing
// and leaves the container running and stoppable (CRIU is killed, not waited for).
func TestE2ECheckpointDeadline(t *testing.T) {
	testutil.RequiresRoot(t, rootWhy)
	if out, err := exec.Command("criu", "check").CombinedOutput(); err != nil {
		t.Skipf("criu check failed (install CRIU >= 4 with hack/criu.sh): %v: %s", err, bytes.TrimSpace(out))
	}
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	ref := e.busybox(ctx)
	pod := e.podConfig("ckpt-deadline")
	podID := e.runPod(ctx, pod)
	cfg := ctrConfig("counter", ref, "sh", "-c", "i=0; while :; do echo $i; i=$((i+1)); sleep 0.2; done")
	cfg.Linux.SecurityContext.NamespaceOptions = &cri.NamespaceOption{Pid: cri.NamespaceMode_CONTAINER}
	id := e.runCtr(ctx, podID, pod, cfg)
	logPath := filepath.Join(pod.LogDirectory, cfg.LogPath)
	waitCount(t, logPath, 2, 20*time.Second)
	location := filepath.Join(t.TempDir(), "c.tar")
	start := time.Now()
	_, err := e.rt.CheckpointContainer(ctx, &cri.CheckpointContainerRequest{ContainerId: id, Location: location, Timeout: 3})
	took := time.Since(start)
	if took > 6*time.Second {
		t.Errorf("CheckpointContainer with timeout 3 took %v", took)
	}
	switch status.Code(err) {
	case codes.OK:
		if _, err := os.Stat(location); err != nil {
			t.Errorf("checkpoint succeeded but wrote no archive: %v", err)
		}
	case codes.DeadlineExceeded:
		if entries, _ := os.ReadDir(filepath.Dir(location)); len(entries) > 0 {
			t.Errorf("a timed-out checkpoint left %v", entries)
		}
		t.Logf("checkpoint timed out after %v: %v", took, err)
	default:
		t.Fatalf("CheckpointContainer: %v", err)
	}
	// The container counts on, and stops promptly: nothing holds it.
	n := len(counts(t, logPath))
	waitCount(t, logPath, n+2, 10*time.Second)
	start = time.Now()
	if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("StopContainer after the checkpoint took %v", d)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.root, "checkpoints", "*")); len(left) > 0 {
		t.Errorf("checkpoint staging dirs left: %v", left)
	}
}
