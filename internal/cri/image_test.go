package cri

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestImageUser(t *testing.T) {
	cases := []struct {
		in    string
		uid   int64
		name  string
		isNil bool
	}{
		{"", 0, "", true},
		{"1000", 1000, "", false},
		{"0:0", 0, "", false},
		{"app", 0, "app", true},
		{"app:grp", 0, "app", true},
	}
	for _, tc := range cases {
		uid, name := imageUser(tc.in)
		if (uid == nil) != tc.isNil || (uid != nil && *uid != tc.uid) || name != tc.name {
			t.Errorf("imageUser(%q) = %v, %q", tc.in, uid, name)
		}
	}
}

// TestPullErrorCodes: a pull that failed because its caller gave up is DeadlineExceeded
// when the deadline is (about to be) reached, also when the cancellation arrived a
// moment before it as gRPC delivers it, Canceled otherwise; other failures keep their
// own code.
func TestPullErrorCodes(t *testing.T) {
	s := &Service{log: slog.New(slog.DiscardHandler)}
	start := time.Now()
	pullErr := fmt.Errorf("fetch layer: %w", context.Canceled)

	expired, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-expired.Done()
	// The client's RST_STREAM: cancelled a few milliseconds before the deadline.
	rst, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(5*time.Millisecond))
	defer cancel2()
	rstCtx, cancelRst := context.WithCancel(rst)
	cancelRst()
	// Cancelled long before its deadline.
	early, cancel3 := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel3()
	earlyCtx, cancelEarly := context.WithCancel(early)
	cancelEarly()
	noDeadline, cancel4 := context.WithCancel(context.Background())
	cancel4()

	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want codes.Code
		msg  string
	}{
		{"deadline passed", expired, pullErr, codes.DeadlineExceeded, "the caller's deadline passed"},
		{"cancelled at the deadline", rstCtx, pullErr, codes.DeadlineExceeded, "the caller's deadline passed"},
		{"cancelled early", earlyCtx, pullErr, codes.Canceled, "the caller cancelled it"},
		{"cancelled, no deadline", noDeadline, pullErr, codes.Canceled, "the caller cancelled it"},
		{"registry error", context.Background(), fmt.Errorf("manifest: %w", errdefs.ErrNotFound), codes.NotFound, "manifest"},
	} {
		err := toStatus(s.pullError(tc.ctx, "example.com/app:v1", start, tc.err))
		if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), `"example.com/app:v1"`) {
			t.Errorf("%s: %v, want %s mentioning %q", tc.name, err, tc.want, tc.msg)
		}
	}
}
