package wasm

import (
	"context"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

func TestParseCgroupsPath(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    containerCgroup
		wantErr bool
	}{
		{in: "/crisp/crisp-c1", want: containerCgroup{Path: "/crisp/crisp-c1"}},
		{in: "kubepods.slice:crisp:c1", want: containerCgroup{Slice: "kubepods.slice", Prefix: "crisp", Name: "c1"}},
		{in: "relative/path", wantErr: true},
		{in: "/a/../b", wantErr: true},
		{in: ":crisp:c1", wantErr: true},
		{in: "kubepods.slice:crisp:", wantErr: true},
		{in: "", wantErr: true},
	} {
		got, err := parseCgroupsPath(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("parseCgroupsPath(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// What a WebAssembly container cannot do is refused with the kind the CRI reports: a
// terminal and bad specs as InvalidArgument, exec, update and restore as Unimplemented.
func TestRefusals(t *testing.T) {
	r, err := NewRunner(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.Create(ctx, &task.CreateRequest{ID: "c1", Bundle: t.TempDir(), Terminal: true}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("create with a terminal = %v, want InvalidArgument", err)
	}
	if _, err := r.Create(ctx, &task.CreateRequest{ID: "c1", Bundle: t.TempDir()}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("create of a bundle without a spec = %v, want InvalidArgument", err)
	}
	if _, err := r.Create(ctx, &task.CreateRequest{ID: "c1", Bundle: t.TempDir(), Checkpoint: "/x"}); !errdefs.IsNotImplemented(err) {
		t.Errorf("create from a checkpoint = %v, want NotImplemented", err)
	}
	if _, err := r.Exec(ctx, &task.ExecRequest{ID: "c1", ExecID: "e1"}); !errdefs.IsNotImplemented(err) {
		t.Errorf("exec = %v, want NotImplemented", err)
	}
	if err := r.Update(ctx, "c1", []byte("{}")); !errdefs.IsNotImplemented(err) {
		t.Errorf("update = %v, want NotImplemented", err)
	}
	if err := r.Start(ctx, "c9", nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("start of an unknown container = %v, want FailedPrecondition", err)
	}
}
