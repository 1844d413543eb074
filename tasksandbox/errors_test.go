package tasksandbox

import (
	"context"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestIsNotFound(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"shim NotFound", status.Error(codes.NotFound, `container "c" not found`), true},
		{"wrapped shim NotFound", fmt.Errorf("kill: %w", status.Error(codes.NotFound, "no such task")), true},
		{"in process", fmt.Errorf("task c: %w", errdefs.ErrNotFound), true},
		{"shim FailedPrecondition", status.Error(codes.FailedPrecondition, "not stopped"), false},
		{"shim Unknown saying not found", status.Error(codes.Unknown, "not found"), false},
		{"closed", ttrpc.ErrClosed, false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
	}
	for _, tc := range cases {
		if got := isNotFound(tc.err); got != tc.want {
			t.Errorf("%s: isNotFound(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
