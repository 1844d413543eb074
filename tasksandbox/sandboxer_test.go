package tasksandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/crisp-runtime/crisp/internal/config"
)

func newTestSandboxer(t *testing.T) *Sandboxer {
	t.Helper()
	dir := t.TempDir()
	s, err := New(Config{
		Runtimes: map[string]config.Runtime{
			"runc-v2": {Shim: "containerd-shim-runc-v2", SandboxMode: config.SandboxModeTask},
			"crisp":   {Shim: "shim-runc"},
		},
		StateDir: dir, ContainerDir: filepath.Join(dir, "containers"), SocketDir: filepath.Join(dir, "s"), Log: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newContainer makes container id's bundle and its output copy, as CreateContainer
// does for a container of pod.
func newContainer(t *testing.T, s *Sandboxer, pod, id string) {
	t.Helper()
	if err := os.MkdirAll(s.containerBundle(id), 0o711); err != nil {
		t.Fatal(err)
	}
	stdin, stdout, stderr, err := s.OpenIO(id, IORecord{SandboxID: pod, LogPath: filepath.Join(t.TempDir(), id+".log")})
	if err != nil {
		t.Fatal(err)
	}
	if stdin != "" || stdout == "" || stderr == "" {
		t.Fatalf("FIFOs %q %q %q: want stdout and stderr only", stdin, stdout, stderr)
	}
	t.Cleanup(func() { s.DropIO(id) })
}

func TestSandboxerHandlers(t *testing.T) {
	s := newTestSandboxer(t)
	if s.Handlers() != 1 || s.Options("runc-v2") == nil || s.Options("crisp") != nil {
		t.Errorf("handlers %d, options %v / %v: want runc-v2's alone", s.Handlers(), s.Options("runc-v2"), s.Options("crisp"))
	}
}

// A pod's containers are those whose io.json names it, and an orphan container's pod
// is found the same way.
func TestPodContainersAndOrphanPod(t *testing.T) {
	s := newTestSandboxer(t)
	newContainer(t, s, "pod-a", "c1")
	newContainer(t, s, "pod-a", "c2")
	newContainer(t, s, "pod-b", "c3")
	if err := os.MkdirAll(s.containerBundle("crisp-shim-container"), 0o711); err != nil {
		t.Fatal(err) // a container of crisp's own shim: no io.json
	}
	var got []string
	for id := range s.PodContainers("pod-a") {
		got = append(got, id)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"c1", "c2"}) {
		t.Errorf("containers of pod-a: %v", got)
	}
	pod, release, ok := s.OrphanPod("c3")
	if !ok || pod != "pod-b" {
		t.Fatalf("OrphanPod(c3) = %q, %v: want pod-b", pod, ok)
	}
	release()
	if _, _, ok := s.OrphanPod("crisp-shim-container"); ok {
		t.Error("a container without io.json taken for a task-only shim's")
	}
}

// deletes records the shim binary's deletes, in order.
type deletes struct {
	calls []string
	fail  map[string]bool
}

func (d *deletes) Delete(_ context.Context, id, bundle string) error {
	d.calls = append(d.calls, id+"@"+filepath.Base(bundle))
	if d.fail[id] {
		return errors.New("delete failed")
	}
	return nil
}

// A dead shim's pod is cleaned up container by container, then its pause container;
// the output copies stop. A pause container that was never started may not exist.
func TestCleanDeadShim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		started bool
		wantErr bool
	}{
		{"started pod", true, true},
		{"start cut short", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSandboxer(t)
			newContainer(t, s, "pod", "c1")
			d := &deletes{fail: map[string]bool{"pod": true}}
			p := Pod{ID: "pod", Handler: "runc-v2", Bundle: filepath.Join(t.TempDir(), "pod"), Started: tc.started, Binary: d}
			err := s.CleanDeadShim(context.Background(), p)
			if (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want an error: %v", err, tc.wantErr)
			}
			if !slices.Equal(d.calls, []string{"c1@c1", "pod@pod"}) {
				t.Errorf("deletes %v: want the container's, then the pause's", d.calls)
			}
			if s.IO("c1") != nil {
				t.Error("the container's output copy outlived its shim")
			}
		})
	}
}
