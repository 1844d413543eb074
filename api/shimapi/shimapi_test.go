package shimapi

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	optionsv1 "github.com/crisp-runtime/crisp/api/options/v1"
)

type fake struct{ reopened []string }

func (f *fake) ReopenLog(ctx context.Context, req *optionsv1.ReopenLogRequest) (*optionsv1.ReopenLogResponse, error) {
	if req.GetContainerId() == "missing" {
		return nil, status.Error(codes.NotFound, "container missing not found")
	}
	f.reopened = append(f.reopened, req.GetContainerId())
	return &optionsv1.ReopenLogResponse{}, nil
}

func (f *fake) ContainerInfo(ctx context.Context, req *optionsv1.ContainerInfoRequest) (*optionsv1.ContainerInfoResponse, error) {
	return &optionsv1.ContainerInfoResponse{OomKilled: req.GetContainerId() == "oom"}, nil
}

func (f *fake) Attach(ctx context.Context, req *optionsv1.AttachRequest) (*optionsv1.AttachResponse, error) {
	if req.GetContainerId() != "a" || req.GetStdout() != "/out" {
		return nil, status.Error(codes.NotFound, "container not found")
	}
	return &optionsv1.AttachResponse{}, nil
}

// TestRoundTrip serves a fake over a real unix socket and calls it through the client.
func TestRoundTrip(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	f := &fake{}
	Register(srv, f)
	go srv.Serve(context.Background(), l)
	defer srv.Close()

	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	defer tc.Close()
	c := NewClient(tc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	if _, err := c.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: "a"}); err != nil {
		t.Fatal(err)
	}
	if len(f.reopened) != 1 || f.reopened[0] != "a" {
		t.Errorf("server saw %v", f.reopened)
	}
	if _, err := c.ReopenLog(ctx, &optionsv1.ReopenLogRequest{ContainerId: "missing"}); status.Code(err) != codes.NotFound {
		t.Errorf("error code = %v, want NotFound", err)
	}
	for id, want := range map[string]bool{"oom": true, "fine": false} {
		resp, err := c.ContainerInfo(ctx, &optionsv1.ContainerInfoRequest{ContainerId: id})
		if err != nil || resp.GetOomKilled() != want {
			t.Errorf("ContainerInfo(%s) = %v, %v; want oom_killed %v", id, resp, err, want)
		}
	}
	if _, err := c.Attach(ctx, &optionsv1.AttachRequest{ContainerId: "a", Stdout: "/out"}); err != nil {
		t.Errorf("Attach: %v", err)
	}
	if _, err := c.Attach(ctx, &optionsv1.AttachRequest{ContainerId: "b"}); status.Code(err) != codes.NotFound {
		t.Errorf("Attach(b) = %v, want NotFound", err)
	}
}
