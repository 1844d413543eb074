package spec

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// vendorSpec defines vendor.com/dev=null1 (host /dev/null at /dev/vendor-null, an env
// var, a read-only bind mount of DATA and a createRuntime hook) and vendor.com/dev=zero1
// (host /dev/zero at /dev/vendor-zero and an env var).
const vendorSpec = `{
  "cdiVersion": "0.6.0",
  "kind": "vendor.com/dev",
  "devices": [
    {"name": "null1", "containerEdits": {
      "deviceNodes": [{"path": "/dev/vendor-null", "hostPath": "/dev/null"}],
      "env": ["VENDOR_DEV=null1"],
      "mounts": [{"hostPath": "DATA", "containerPath": "/vendor/data", "options": ["ro", "bind"]}],
      "hooks": [{"hookName": "createRuntime", "path": "/bin/true", "args": ["true", "null1"]}]
    }},
    {"name": "zero1", "containerEdits": {
      "deviceNodes": [{"path": "/dev/vendor-zero", "hostPath": "/dev/zero"}],
      "env": ["VENDOR_ZERO=1"]
    }}
  ]
}`

// writeCDIDir writes spec files (name → content; DATA in a content is replaced by a
// host file) into a new directory and returns it.
func writeCDIDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(data, []byte("vendor data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.ReplaceAll(content, "DATA", data)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func findDevice(s *specs.Spec, path string) *specs.LinuxDevice {
	for i := range s.Linux.Devices {
		if s.Linux.Devices[i].Path == path {
			return &s.Linux.Devices[i]
		}
	}
	return nil
}

// allowsDevice says the device cgroup rules end up allowing c major:minor.
func allowsDevice(s *specs.Spec, major, minor int64) bool {
	allowed := false
	for _, r := range s.Linux.Resources.Devices {
		if (r.Type == "" || r.Type == "a" || r.Type == "c") && (r.Major == nil || *r.Major == major) && (r.Minor == nil || *r.Minor == minor) {
			allowed = r.Allow && strings.Contains(r.Access, "rw")
		}
	}
	return allowed
}

func TestCDIDevices(t *testing.T) {
	cases := []struct {
		name        string
		devices     []string
		annotations map[string]string
		// wantNodes are container paths of injected device nodes with their major:minor.
		wantNodes map[string][2]int64
		wantEnv   []string
		noEnv     []string
		wantMount bool
		wantHooks int
	}{
		{
			name:      "CRI CDIDevices: node, env, mount, hook",
			devices:   []string{"vendor.com/dev=null1"},
			wantNodes: map[string][2]int64{"/dev/vendor-null": {1, 3}},
			wantEnv:   []string{"VENDOR_DEV=null1"},
			noEnv:     []string{"VENDOR_ZERO=1"},
			wantMount: true,
			wantHooks: 1,
		},
		{
			name:        "device plugin annotation",
			annotations: map[string]string{"cdi.k8s.io/vendor.dev_zero": "vendor.com/dev=zero1"},
			wantNodes:   map[string][2]int64{"/dev/vendor-zero": {1, 5}},
			wantEnv:     []string{"VENDOR_ZERO=1"},
			noEnv:       []string{"VENDOR_DEV=null1"},
		},
		{
			name:        "both, the same device twice is injected once",
			devices:     []string{"vendor.com/dev=null1", "vendor.com/dev=null1"},
			annotations: map[string]string{"cdi.k8s.io/a": "vendor.com/dev=zero1,vendor.com/dev=null1", "other/x": "not-a-device"},
			wantNodes:   map[string][2]int64{"/dev/vendor-null": {1, 3}, "/dev/vendor-zero": {1, 5}},
			wantEnv:     []string{"VENDOR_DEV=null1", "VENDOR_ZERO=1"},
			wantMount:   true,
			wantHooks:   1,
		},
		{
			name:    "none requested",
			noEnv:   []string{"VENDOR_DEV=null1", "VENDOR_ZERO=1"},
			devices: nil,
		},
	}
	setHost(t, defaultHost())
	cdi := NewCDI([]string{writeCDIDir(t, map[string]string{"vendor.json": vendorSpec})})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			in.CDI = cdi
			for _, d := range tc.devices {
				in.Config.CDIDevices = append(in.Config.CDIDevices, &runtime.CDIDevice{Name: d})
			}
			in.Config.Annotations = tc.annotations
			s := mustGenerate(t, in).Spec
			for path, mm := range tc.wantNodes {
				d := findDevice(s, path)
				if d == nil {
					t.Fatalf("no device %s in %+v", path, s.Linux.Devices)
				}
				if d.Type != "c" || d.Major != mm[0] || d.Minor != mm[1] {
					t.Errorf("device %s = %s %d:%d, want c %d:%d", path, d.Type, d.Major, d.Minor, mm[0], mm[1])
				}
				if !allowsDevice(s, mm[0], mm[1]) {
					t.Errorf("device cgroup does not allow %s: %+v", path, s.Linux.Resources.Devices)
				}
			}
			if n := len(s.Linux.Devices); n != len(tc.wantNodes) {
				t.Errorf("%d devices, want %d: %+v", n, len(tc.wantNodes), s.Linux.Devices)
			}
			for _, e := range tc.wantEnv {
				if !slices.Contains(s.Process.Env, e) {
					t.Errorf("env %q lacks %s", s.Process.Env, e)
				}
			}
			for _, e := range tc.noEnv {
				if slices.Contains(s.Process.Env, e) {
					t.Errorf("env %q has %s", s.Process.Env, e)
				}
			}
			m := findMount(s, "/vendor/data")
			if tc.wantMount != (m != nil) {
				t.Fatalf("mount /vendor/data = %+v, want it: %v", m, tc.wantMount)
			}
			if m != nil && (!strings.HasSuffix(m.Source, "/data") || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "bind")) {
				t.Errorf("mount /vendor/data = %+v, want a read-only bind of the data file", m)
			}
			hooks := 0
			if s.Hooks != nil {
				hooks = len(s.Hooks.CreateRuntime)
				if hooks > 0 && s.Hooks.CreateRuntime[0].Path != "/bin/true" {
					t.Errorf("createRuntime hook %+v", s.Hooks.CreateRuntime[0])
				}
			}
			if hooks != tc.wantHooks {
				t.Errorf("%d createRuntime hooks, want %d", hooks, tc.wantHooks)
			}
		})
	}
}

func TestCDIDeviceErrors(t *testing.T) {
	const dup = `{"cdiVersion": "0.6.0", "kind": "vendor.com/dev", "devices": [
	  {"name": "dup", "containerEdits": {"env": ["DUP=FILE"]}}]}`
	const invalid = `{"cdiVersion": "0.6.0", "kind": "vendor.com/bad", "devices": [
	  {"name": "badtype", "containerEdits": {"deviceNodes": [{"path": "/dev/bad", "type": "z"}]}}]}`
	const missingHost = `{"cdiVersion": "0.6.0", "kind": "vendor.com/gone", "devices": [
	  {"name": "g0", "containerEdits": {"deviceNodes": [{"path": "/dev/gone", "hostPath": "/dev/crisp-test-no-such-device"}]}}]}`
	dir := writeCDIDir(t, map[string]string{
		"vendor.json": vendorSpec,
		// dup.json and dup2.json both define vendor.com/dev=dup at the same priority.
		"dup.json":  strings.ReplaceAll(dup, "FILE", "1"),
		"dup2.json": strings.ReplaceAll(dup, "FILE", "2"),
		"bad.json":  invalid,
		"gone.json": missingHost,
	})
	cases := []struct {
		name string
		// off runs without CDI (no spec dirs configured).
		off         bool
		devices     []string
		annotations map[string]string
		is          func(error) bool
		contains    []string
	}{
		{name: "unknown device", devices: []string{"vendor.com/dev=null1", "vendor.com/dev=nope"},
			is: isInvalid, contains: []string{`unknown CDI device "vendor.com/dev=nope"`, dir}},
		{name: "unknown annotated device", annotations: map[string]string{"cdi.k8s.io/x": "vendor.com/other=0"},
			is: isInvalid, contains: []string{`"vendor.com/other=0"`}},
		{name: "ambiguous device", devices: []string{"vendor.com/dev=dup"},
			is: isInvalid, contains: []string{`CDI device "vendor.com/dev=dup" is ambiguous`, "dup.json, ", "dup2.json"}},
		{name: "spec that fails validation", devices: []string{"vendor.com/bad=badtype"},
			is: isInvalid, contains: []string{`unknown CDI device "vendor.com/bad=badtype"`, "bad.json failed to load", `invalid type "z"`}},
		{name: "host device missing", devices: []string{"vendor.com/gone=g0"},
			is: isInvalid, contains: []string{`CDI devices "vendor.com/gone=g0"`, "crisp-test-no-such-device"}},
		{name: "unqualified CRI name", devices: []string{"null1"},
			is: isInvalid, contains: []string{`CDI device "null1"`}},
		{name: "unqualified annotation", annotations: map[string]string{"cdi.k8s.io/x": "vendor.com/dev=null1,zero1"},
			is: isInvalid, contains: []string{`"zero1"`, "cdi.k8s.io/"}},
		{name: "CDI off", off: true, devices: []string{"vendor.com/dev=null1"},
			is: errdefs.IsFailedPrecondition, contains: []string{`"vendor.com/dev=null1"`, "cdi.spec_dirs"}},
	}
	setHost(t, defaultHost())
	on := NewCDI([]string{dir})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := baseInput(t)
			if !tc.off {
				in.CDI = on
			}
			for _, d := range tc.devices {
				in.Config.CDIDevices = append(in.Config.CDIDevices, &runtime.CDIDevice{Name: d})
			}
			in.Config.Annotations = tc.annotations
			_, err := Generate(in)
			for _, c := range tc.contains {
				wantErr(t, err, tc.is, c)
			}
		})
	}
}

// A spec file written after criserver started (a device plugin registering) is found
// by the next container that asks for its device, without waiting for a watcher.
func TestCDISpecAddedLater(t *testing.T) {
	setHost(t, defaultHost())
	dir := t.TempDir()
	cdi := NewCDI([]string{dir})
	in := baseInput(t)
	in.CDI = cdi
	in.Config.CDIDevices = []*runtime.CDIDevice{{Name: "vendor.com/dev=zero1"}}
	if _, err := Generate(in); !isInvalid(err) {
		t.Fatalf("before the spec file exists: got %v, want InvalidArgument", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vendor.json"), []byte(vendorSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	if d := findDevice(mustGenerate(t, in).Spec, "/dev/vendor-zero"); d == nil {
		t.Fatal("device of the new spec file not injected")
	}
}
