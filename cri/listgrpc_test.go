package cri

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkListGRPC is ListContainers of 200 containers with kubelet-like labels and
// annotations through a real gRPC server and client on a unix socket: what a list costs
// end to end, client decoding included.
func BenchmarkListGRPC(b *testing.B) {
	h := func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }
	s := &Service{containers: map[string]*container{}}
	for i := range 200 {
		id := h(fmt.Sprint("c", i))
		s.containers[id] = &container{
			rec:    containerRecord{ID: id, PodID: h(fmt.Sprint("p", i/2)), ImageID: "sha256:" + h("img"), ImageRef: "127.0.0.1:40000/busybox@sha256:" + h("img"), State: stateRunning, CreatedAt: time.Now().UnixNano()},
			config: &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "sleep"}, Image: &runtime.ImageSpec{Image: "127.0.0.1:40000/busybox:bench"}, Labels: map[string]string{"io.kubernetes.pod.name": "pod-" + fmt.Sprint(i), "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": h(fmt.Sprint(i))[:36], "io.kubernetes.container.name": "sleep"}, Annotations: map[string]string{"io.kubernetes.container.hash": "abcdef", "io.kubernetes.container.restartCount": "0", "io.kubernetes.container.terminationMessagePath": "/dev/termination-log"}},
		}
	}
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
