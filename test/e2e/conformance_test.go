package e2e

import (
	"math"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/version"
)

// semverRE is semver.org's regular expression for a valid semantic version.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// TestE2EConformance checks CRI behaviour kubelet (and critest) rely on where crisp
// once differed from containerd: the version format, idempotent stops, run_as_group
// without a user, and CRI timeouts too large for a time.Duration.
func TestE2EConformance(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)

	t.Run("runtime version is semver", func(t *testing.T) {
		v, err := e.rt.Version(ctx, &cri.VersionRequest{Version: "v1"})
		if err != nil {
			t.Fatal(err)
		}
		if v.GetVersion() != "0.1.0" || v.GetRuntimeName() != version.Name || v.GetRuntimeApiVersion() != "v1" {
			t.Errorf("Version = %+v, want version 0.1.0, runtime %s, API v1", v, version.Name)
		}
		// The harness builds with make VERSION=<this test binary's version>.
		if rv := v.GetRuntimeVersion(); !semverRE.MatchString(rv) || rv != version.Version {
			t.Errorf("runtime_version = %q, want the semantic version %q", rv, version.Version)
		}
	})

	t.Run("StopContainer of an unknown id succeeds", func(t *testing.T) {
		if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: "0123456789abcdef", Timeout: 10}); err != nil {
			t.Errorf("StopContainer(unknown) = %v, want OK", err)
		}
		if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("StopContainer(\"\") = %v, want InvalidArgument", err)
		}
	})

	t.Run("pod run_as_group without run_as_user is refused", func(t *testing.T) {
		pod := e.podConfig("groupless")
		pod.Linux.SecurityContext.RunAsGroup = &cri.Int64Value{Value: 3000}
		resp, err := e.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod})
		if err == nil {
			e.stopRemove(ctx, t, resp.GetPodSandboxId())
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("RunPodSandbox = %v, want InvalidArgument", err)
		}
		if list, err := e.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err != nil || len(list.GetItems()) != 0 {
			t.Errorf("after the refused pod: pods %v, err %v; want none", list.GetItems(), err)
		}
	})

	img := e.busybox(ctx)
	pod := e.podConfig("conformance")
	podID := e.runPod(ctx, pod)

	t.Run("container run_as_group without a user is refused", func(t *testing.T) {
		cfg := ctrConfig("groupless", img, "true")
		cfg.Linux.SecurityContext.RunAsGroup = &cri.Int64Value{Value: 3000}
		resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
		if err == nil {
			_, _ = e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.GetContainerId()})
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("CreateContainer = %v, want InvalidArgument", err)
		}
		if list, err := e.rt.ListContainers(ctx, &cri.ListContainersRequest{}); err != nil || len(list.GetContainers()) != 0 {
			t.Errorf("after the refused container: containers %v, err %v; want none", list.GetContainers(), err)
		}
	})

	t.Run("timeouts of math.MaxInt64 seconds mean no limit", func(t *testing.T) {
		// The shell exits 0 on SIGTERM: an immediate SIGKILL (exit 137) would show a
		// stop timeout that wrapped around. The stop waits for "trapped": a SIGTERM
		// before the trap is set would end the shell with 143.
		id := e.runCtr(ctx, podID, pod, ctrConfig("patient", img, "sh", "-c", `trap "exit 0" TERM; echo trapped; sleep 1000 & wait`))
		resp, err := e.execSync(ctx, id, math.MaxInt64, "echo", "hi")
		if err != nil {
			t.Errorf("ExecSync with timeout MaxInt64: %v", err)
		} else if string(resp.GetStdout()) != "hi\n" || resp.GetExitCode() != 0 {
			t.Errorf("ExecSync = stdout %q exit %d, want \"hi\\n\" exit 0", resp.GetStdout(), resp.GetExitCode())
		}
		waitLogLine(t, filepath.Join(pod.LogDirectory, "patient.log"), "stdout trapped", 10*time.Second)
		if _, err := e.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: math.MaxInt64}); err != nil {
			t.Fatalf("StopContainer with timeout MaxInt64: %v", err)
		}
		st, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if s := st.GetStatus(); s.GetState() != cri.ContainerState_CONTAINER_EXITED || s.GetExitCode() != 0 {
			t.Errorf("after StopContainer: state %s exit %d, want exited 0 (stopped by SIGTERM)", s.GetState(), s.GetExitCode())
		}
	})

	e.stopRemove(ctx, t, podID)
	e.assertNodeClean(t)
}
