package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskv3 "github.com/crisp-runtime/crisp/api/containerd/task/v3"
	"github.com/crisp-runtime/crisp/api/containerd/types"
	"github.com/crisp-runtime/crisp/internal/testutil"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// fakeHelper writes an executable that stands in for the task helper: it records its
// arguments and request and then runs body.
func fakeHelper(t *testing.T, body string) (path, record string) {
	t.Helper()
	dir := t.TempDir()
	path, record = filepath.Join(dir, "helper"), filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$@\" >>" + record + "\ncat >>" + record + "\necho >>" + record + "\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, record
}

// TestHelperAnswers checks how the service maps what its helper says: an error answer
// keeps its gRPC code and message (the helper has undone its work), and a helper that
// dies without answering is Internal and is followed by a delete helper that cleans up
// whatever it may have left, with the bundle to find the rootfs by.
func TestHelperAnswers(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		code       codes.Code
		msg        string
		cleanup    bool
	}{
		{"error answer", `echo '{"code":3,"error":"container \"c1\": spec has no process"}'`, codes.InvalidArgument, `container "c1": spec has no process`, false},
		{"no answer", "exit 2", codes.Internal, "create helper of container \"c1\" gave no answer", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			helper, record := fakeHelper(t, tt.body)
			rp := reaper.New(discard())
			r, err := New(Config{StateRoot: t.TempDir(), Reaper: rp, Logger: discard(), Helper: helper})
			if err != nil {
				t.Fatal(err)
			}
			s, err := task.New(task.Config{Runner: r, Reaper: rp, Logger: discard()})
			if err != nil {
				t.Fatal(err)
			}
			bundle := t.TempDir()
			_, err = s.Create(context.Background(), &taskv3.CreateTaskRequest{ID: "c1", Bundle: bundle,
				Rootfs: []*types.Mount{{Type: "bind", Source: "/", Options: []string{"rbind"}}}})
			st, _ := status.FromError(task.GRPCStatus(err))
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.msg) {
				t.Fatalf("Create = %v; want %v containing %q", err, tt.code, tt.msg)
			}
			// Nothing is left of the id: not listed, and free for the next Create.
			if _, err := s.State(context.Background(), &taskv3.StateRequest{ID: "c1"}); status.Code(task.GRPCStatus(err)) != codes.NotFound {
				t.Errorf("State of c1 after a failed create = %v, want NotFound", err)
			}
			data, err := os.ReadFile(record)
			if err != nil {
				t.Fatal(err)
			}
			calls := string(data)
			if !strings.HasPrefix(calls, HelperArg+" create c1\n") || !strings.Contains(calls, `"bundle":"`+bundle+`"`) {
				t.Errorf("helper calls:\n%s\nwant a create of c1 with its bundle first", calls)
			}
			cleaned := strings.Contains(calls, HelperArg+" delete c1\n")
			if cleaned != tt.cleanup {
				t.Errorf("helper calls:\n%s\ncleanup ran: %v, want %v", calls, cleaned, tt.cleanup)
			}
			if tt.cleanup && !strings.Contains(calls, `"rootfs_from_state":true`) {
				t.Errorf("cleanup after a silent helper does not unmount the rootfs:\n%s", calls)
			}
		})
	}
}

// TestHelperFiles checks the fd numbers the helper finds the stdio at.
func TestHelperFiles(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	files, fds := helperFiles(task.Stdio{Stdin: r, Stderr: w})
	if len(files) != 2 || files[0] != r || files[1] != w {
		t.Fatalf("files = %v", files)
	}
	if fds != (helperStdio{Stdin: 3, Stderr: 4}) {
		t.Errorf("fds = %+v, want stdin 3, stderr 4, no stdout or console", fds)
	}
}

// TestHelperSurvivesEndingThreads: a helper is killed when the shim dies (Pdeathsig),
// not when the OS thread it was started from ends, which happens whenever a goroutine
// that locked its thread returns and the runtime had given it that thread.
func TestHelperSurvivesEndingThreads(t *testing.T) {
	helper, _ := fakeHelper(t, "sleep 1; echo '{}'")
	s, err := New(Config{StateRoot: t.TempDir(), Reaper: reaper.New(discard()), Logger: discard(), Helper: helper})
	if err != nil {
		t.Fatal(err)
	}
	testutil.EndThreads(t)
	const helpers = 16
	errs := make(chan error, helpers)
	var wg sync.WaitGroup
	for i := range helpers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.runHelper(context.Background(), helperPause, &helperRequest{ID: fmt.Sprintf("c%d", i)}, nil)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("helper while threads end: %v", err)
		}
	}
}
