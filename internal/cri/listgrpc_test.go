package cri

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkListGRPC is ListContainers of 200 containers with kubelet-like labels and
// annotations through a real gRPC server and client on a unix socket: what a list costs
// end to end, client decoding included.
func BenchmarkListGRPC(b *testing.B) {
	s := listBenchService(200, true)
	sock := filepath.Join(b.TempDir(), "s")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	runtime.RegisterRuntimeServiceServer(srv, s)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := runtime.NewRuntimeServiceClient(conn)
	ctx := context.Background()
	b.Run("list200", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.ListContainers(ctx, &runtime.ListContainersRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
