package cri

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/selinux/go-selinux"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/mount"
)

// fakeSELinux is the label library as on a host whose policy has the container
// contexts: label.InitLabels' rules (a new level for each call, reserved; a level the
// options give replaces it and is reserved, even if already in use) over a level
// table of its own. Levels are handed out in order from next.
type fakeSELinux struct {
	next     []string
	reserved map[string]bool
}

func newFakeSELinux(levels ...string) *fakeSELinux {
	return &fakeSELinux{next: levels, reserved: map[string]bool{}}
}

func (f *fakeSELinux) InitLabels(options []string) (string, string, error) {
	var lv string
	for {
		if len(f.next) == 0 {
			return "", "", fmt.Errorf("no level left")
		}
		lv, f.next = f.next[0], f.next[1:]
		if !f.reserved[lv] {
			break
		}
	}
	f.reserved[lv] = true
	pcon := selinux.Context{"user": "system_u", "role": "system_r", "type": "container_t", "level": lv}
	mcon := selinux.Context{"user": "system_u", "role": "object_r", "type": "container_file_t", "level": lv}
	for _, o := range options {
		k, v, _ := strings.Cut(o, ":")
		pcon[k] = v
		if k == "level" || k == "user" {
			mcon[k] = v
		}
	}
	if pcon["level"] != lv {
		delete(f.reserved, lv)
		f.reserved[pcon["level"]] = true
	}
	return pcon.Get(), mcon.Get(), nil
}

func (f *fakeSELinux) Reserve(l string) error {
	lv := level(l)
	if f.reserved[lv] {
		return selinux.ErrMCSAlreadyExists
	}
	f.reserved[lv] = true
	return nil
}

func (f *fakeSELinux) Release(l string) { delete(f.reserved, level(l)) }

func TestSELinuxPodLevels(t *testing.T) {
	f := newFakeSELinux("s0:c1,c2", "s0:c3,c4", "s0:c5,c6")
	l := newSELinuxLabels(f)
	p1, m1, err := l.podLabels(nil)
	if err != nil {
		t.Fatal(err)
	}
	p2, _, err := l.podLabels(&runtime.SELinuxOption{})
	if err != nil {
		t.Fatal(err)
	}
	if p1 != "system_u:system_r:container_t:s0:c1,c2" || m1 != "system_u:object_r:container_file_t:s0:c1,c2" {
		t.Errorf("pod 1 labels %q %q", p1, m1)
	}
	if level(p1) == level(p2) {
		t.Errorf("two pods share level %s", level(p1))
	}
	// A level the pod gives is used as given, and held.
	p3, m3, err := l.podLabels(&runtime.SELinuxOption{Level: "s0:c100,c200", Type: "my_t"})
	if err != nil {
		t.Fatal(err)
	}
	if p3 != "system_u:system_r:my_t:s0:c100,c200" || m3 != "system_u:object_r:container_file_t:s0:c100,c200" {
		t.Errorf("pod 3 labels %q %q", p3, m3)
	}
	if !f.reserved["s0:c100,c200"] || f.reserved["s0:c5,c6"] {
		t.Errorf("reserved %v: want the given level, not the drawn one", f.reserved)
	}
	l.release(p1)
	if f.reserved["s0:c1,c2"] {
		t.Error("pod 1's level still reserved after its release")
	}
}

func TestSELinuxBadLevel(t *testing.T) {
	l := newSELinuxLabels(newFakeSELinux("s0:c1,c2"))
	_, _, err := l.podLabels(&runtime.SELinuxOption{Level: "s0:c1;rm -rf"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "is not an MLS/MCS level") {
		t.Errorf("bad level: %v", err)
	}
	_, _, err = l.containerLabels("", &runtime.SELinuxOption{Level: "c1"})
	if !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad container level: %v", err)
	}
}

// TestSELinuxContainerLabels: a container gets the pod's labels, each part its own
// options set replacing the pod's; its level stays held while any user remains.
func TestSELinuxContainerLabels(t *testing.T) {
	f := newFakeSELinux("s0:c1,c2", "s0:c3,c4", "s0:c5,c6", "s0:c7,c8", "s0:c9,c10")
	l := newSELinuxLabels(f)
	pod, _, err := l.podLabels(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts        *runtime.SELinuxOption
		proc, mount string
	}{
		{nil, pod, "system_u:object_r:container_file_t:s0:c1,c2"},
		{&runtime.SELinuxOption{Type: "other_t"}, "system_u:system_r:other_t:s0:c1,c2", "system_u:object_r:container_file_t:s0:c1,c2"},
		{&runtime.SELinuxOption{Level: "s0:c42,c43"}, "system_u:system_r:container_t:s0:c42,c43", "system_u:object_r:container_file_t:s0:c42,c43"},
	} {
		p, m, err := l.containerLabels(pod, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if p != tc.proc || m != tc.mount {
			t.Errorf("options %v: labels %q %q, want %q %q", tc.opts, p, m, tc.proc, tc.mount)
		}
	}
	if n := l.inUse("s0:c1,c2"); n != 3 {
		t.Errorf("pod level held by %d, want 3 (pod and two containers)", n)
	}
	// The pod goes first (its removal removes containers first, but a failed
	// create's undo may come in any order): the level stays until the last user.
	l.release(pod)
	l.release("system_u:system_r:container_t:s0:c1,c2")
	if !f.reserved["s0:c1,c2"] {
		t.Fatal("level released while a container still holds it")
	}
	l.release("system_u:system_r:other_t:s0:c1,c2")
	if f.reserved["s0:c1,c2"] {
		t.Error("level still reserved after its last user went")
	}
	// A container's own level is the container's alone.
	l.release("system_u:system_r:container_t:s0:c42,c43")
	if f.reserved["s0:c42,c43"] {
		t.Error("container's own level still reserved after its release")
	}
	// Releasing what is not held is a no-op.
	l.release("system_u:system_r:container_t:s0:c42,c43")
	l.release("")
}

// TestSELinuxRecoveredLevels: the levels of recovered pods and containers are held
// before any new pod is labelled, so none is handed out twice.
func TestSELinuxRecoveredLevels(t *testing.T) {
	f := newFakeSELinux("s0:c1,c2", "s0:c3,c4")
	l := newSELinuxLabels(f)
	recovered := "system_u:system_r:container_t:s0:c1,c2"
	if err := l.hold(recovered); err != nil {
		t.Fatal(err)
	}
	if err := l.hold(recovered); err != nil { // a container of that pod
		t.Fatal(err)
	}
	p, _, err := l.podLabels(nil)
	if err != nil {
		t.Fatal(err)
	}
	if level(p) == "s0:c1,c2" {
		t.Fatalf("new pod got the recovered pod's level %s", level(p))
	}
	l.release(recovered)
	l.release(recovered)
	if f.reserved["s0:c1,c2"] {
		t.Error("recovered level still reserved after its pod and container went")
	}
}

// TestSELinuxOffNoLabels: with the library disabled (enable_selinux = false, or no
// SELinux) every label is "" and nothing is counted.
func TestSELinuxOffNoLabels(t *testing.T) {
	if selinux.GetEnabled() {
		t.Skip("the host runs SELinux")
	}
	l := newSELinuxLabels(selinuxLib{})
	p, m, err := l.podLabels(&runtime.SELinuxOption{Type: "spc_t", Level: "s0:c1,c2"})
	if err != nil || p != "" || m != "" {
		t.Fatalf("labels without SELinux: %q %q %v", p, m, err)
	}
	if c, cm, err := l.containerLabels(p, nil); err != nil || c != "" || cm != "" {
		t.Fatalf("container labels without SELinux: %q %q %v", c, cm, err)
	}
}

func TestWithMountLabel(t *testing.T) {
	ms := []mount.Mount{
		{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/a", "upperdir=/b", "workdir=/c"}},
		{Type: "bind", Source: "/x", Options: []string{"rbind", "ro"}},
	}
	got := withMountLabel(ms, testMountLabel)
	want := `context="` + testMountLabel + `"`
	if o := got[0].Options; len(o) != 4 || o[3] != want {
		t.Errorf("overlay options %q, want %s last", o, want)
	}
	if len(got[1].Options) != 2 {
		t.Errorf("bind got options %q", got[1].Options)
	}
	if len(ms[0].Options) != 3 {
		t.Errorf("input modified: %q", ms[0].Options)
	}
	if out := withMountLabel(ms, ""); len(out[0].Options) != 3 {
		t.Errorf("no label still added options: %q", out[0].Options)
	}
}

const testMountLabel = "system_u:object_r:container_file_t:s0:c1,c2"
