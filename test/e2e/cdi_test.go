package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cdiSpecE2E defines vendor.com/dev=null1 (host /dev/null at /dev/vendor-null, an env
// var, a read-only bind mount of DATA at /vendor/data and a createRuntime hook that
// saves the OCI state it is given to HOOKOUT) and vendor.com/dev=zero1 (host /dev/zero
// at /dev/vendor-zero and an env var).
const cdiSpecE2E = `{
  "cdiVersion": "0.6.0",
  "kind": "vendor.com/dev",
  "devices": [
    {"name": "null1", "containerEdits": {
      "deviceNodes": [{"path": "/dev/vendor-null", "hostPath": "/dev/null"}],
      "env": ["VENDOR_DEV=null1"],
      "mounts": [{"hostPath": "DATA", "containerPath": "/vendor/data", "options": ["ro", "bind"]}],
      "hooks": [{"hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", "cat > HOOKOUT"]}]
    }},
    {"name": "zero1", "containerEdits": {
      "deviceNodes": [{"path": "/dev/vendor-zero", "hostPath": "/dev/zero"}],
      "env": ["VENDOR_ZERO=1"]
    }}
  ]
}`

// cdiEnv is an env whose criserver reads CDI specs from a directory of its own.
type cdiEnv struct {
	*env
	data    string // the directory bind-mounted at /vendor/data
	hookOut string // where the createRuntime hook writes the container's state
}

func newCDIEnv(t *testing.T) *cdiEnv {
	t.Helper()
	e := newEnv(t)
	c := &cdiEnv{env: e, data: filepath.Join(e.dir, "cdi-data"), hookOut: filepath.Join(e.dir, "cdi-hook.json")}
	specDir := filepath.Join(e.dir, "cdi")
	for _, d := range []string{specDir, c.data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.data, "hello.txt"), []byte("hello from cdi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := strings.NewReplacer("DATA", c.data, "HOOKOUT", c.hookOut).Replace(cdiSpecE2E)
	if err := os.WriteFile(filepath.Join(specDir, "vendor.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	e.appendConfig(fmt.Sprintf("[cdi]\nspec_dirs = [%q]\n", specDir))
	return c
}

// mustExec runs cmd in the container and returns its stdout; a non-zero exit fails.
func (e *env) mustExec(ctx context.Context, t *testing.T, id string, cmd ...string) string {
	t.Helper()
	return e.mustExecWithin(ctx, t, id, 10, cmd...)
}

// mustExecWithin is mustExec with the ExecSync timeout in seconds.
func (e *env) mustExecWithin(ctx context.Context, t *testing.T, id string, timeout int64, cmd ...string) string {
	t.Helper()
	resp, err := e.execSync(ctx, id, timeout, cmd...)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if resp.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stdout %q, stderr %q", cmd, resp.ExitCode, resp.Stdout, resp.Stderr)
	}
	return string(resp.Stdout)
}

func TestE2ECDIDevices(t *testing.T) {
	e := newCDIEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("cdi")
	podID := e.runPod(ctx, pod)

	// null1 through the CRI field, zero1 through kubelet's device-plugin annotation.
	// The init saves its environment: that is the spec's process env.
	cfg := ctrConfig("cdi", img, "sh", "-c", "env > /tmp/env.new && mv /tmp/env.new /tmp/env && exec sleep 3600")
	cfg.CDIDevices = []*cri.CDIDevice{{Name: "vendor.com/dev=null1"}}
	cfg.Annotations = map[string]string{"cdi.k8s.io/vendor.dev_zero1": "vendor.com/dev=zero1"}
	id := e.runCtr(ctx, podID, pod, cfg)

	for path, majMin := range map[string]string{"/dev/vendor-null": `1,\s+3`, "/dev/vendor-zero": `1,\s+5`} {
		out := e.mustExec(ctx, t, id, "ls", "-l", path)
		if !regexp.MustCompile(`^c[rw-]{9}\s.*\s` + majMin + `\s.*` + path).MatchString(out) {
			t.Errorf("ls -l %s = %q, want a char device %s", path, out, majMin)
		}
	}
	// The device cgroup lets the container use them.
	if out := e.mustExec(ctx, t, id, "sh", "-c", "echo x > /dev/vendor-null && head -c 3 /dev/vendor-zero | wc -c"); strings.TrimSpace(out) != "3" {
		t.Errorf("reading /dev/vendor-zero: %q", out)
	}
	env := strings.Split(e.mustExec(ctx, t, id, "sh", "-c", "until [ -f /tmp/env ]; do sleep 0.05; done; cat /tmp/env"), "\n")
	for _, want := range []string{"VENDOR_DEV=null1", "VENDOR_ZERO=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("container env %q lacks %s", env, want)
		}
	}
	if out := e.mustExec(ctx, t, id, "cat", "/vendor/data/hello.txt"); out != "hello from cdi\n" {
		t.Errorf("bind-mounted file: %q", out)
	}
	if resp, err := e.execSync(ctx, id, 10, "touch", "/vendor/data/new"); err != nil || resp.ExitCode == 0 {
		t.Errorf("the read-only CDI mount is writable (err %v)", err)
	}
	// The shim ran the CDI spec's createRuntime hook with the container's state.
	if state, err := os.ReadFile(e.hookOut); err != nil || !strings.Contains(string(state), id) {
		t.Errorf("createRuntime hook output %q (%v): want the state of %s", state, err, id)
	}

	for _, tc := range []struct {
		name        string
		devices     []*cri.CDIDevice
		annotations map[string]string
		want        string
	}{
		{name: "unknown-cri", devices: []*cri.CDIDevice{{Name: "vendor.com/dev=nope"}}, want: `unknown CDI device "vendor.com/dev=nope"`},
		{name: "unknown-annotation", annotations: map[string]string{"cdi.k8s.io/x": "other.com/gpu=0"}, want: `unknown CDI device "other.com/gpu=0"`},
		{name: "unqualified", devices: []*cri.CDIDevice{{Name: "null1"}}, want: `CDI device "null1"`},
	} {
		bad := ctrConfig(tc.name, img, "true")
		bad.CDIDevices, bad.Annotations = tc.devices, tc.annotations
		_, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: bad, SandboxConfig: pod})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: CreateContainer = %v, want InvalidArgument naming %s", tc.name, err, tc.want)
		}
	}
	// A refused container leaves nothing behind: its name is free again.
	retry := ctrConfig("unknown-cri", img, "true")
	if _, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: retry, SandboxConfig: pod}); err != nil {
		t.Errorf("name of the refused container still taken: %v", err)
	}

	if testing.Verbose() {
		e.logCreateLatency(ctx, t, podID, pod, img)
	}
	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
}

// logCreateLatency logs CreateContainer's median without CDI devices, with zero1 (a
// device node and an env var: the cost of resolving a device, refreshed on use) and
// with null1 too (adds a bind mount and a createRuntime hook the shim runs at create).
func (e *env) logCreateLatency(ctx context.Context, t *testing.T, podID string, pod *cri.PodSandboxConfig, img string) {
	t.Helper()
	const runs = 30
	median := func(devices ...string) time.Duration {
		var ds []time.Duration
		for i := range runs {
			cfg := ctrConfig(fmt.Sprintf("lat-%d-%d", len(devices), i), img, "true")
			for _, d := range devices {
				cfg.CDIDevices = append(cfg.CDIDevices, &cri.CDIDevice{Name: d})
			}
			start := time.Now()
			resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
			ds = append(ds, time.Since(start))
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	none, zero, both := median(), median("vendor.com/dev=zero1"), median("vendor.com/dev=zero1", "vendor.com/dev=null1")
	t.Logf("CreateContainer p50 over %d: no CDI device %v, zero1 (node+env) %v, zero1+null1 (node+env+mount+hook) %v", runs, none, zero, both)
}
