package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubeletMaxMsg is kubelet's limit on a CRI message it receives.
const kubeletMaxMsg = 16 << 20

// TestE2EStreamContainers lists 2,000 containers whose list is larger than kubelet's
// 16 MiB message limit: ListContainers cannot return it, StreamContainers can.
func TestE2EStreamContainers(t *testing.T) {
	const (
		pods     = 8
		perPod   = 250
		total    = pods * perPod
		labelLen = 10 << 10 // 2,000 × 10 KiB of labels ≈ 20 MiB
		workers  = 4
	)
	e := newEnv(t)
	e.start()
	// Creating 2,000 containers takes minutes on a small, busy machine (measured: 5-7 min
	// on 2 cores shared with builds, ~60 ms of CPU per created container).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img := e.busybox(ctx)
	// A client as kubelet configures it: at most 16 MiB per received message.
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kubeletMaxMsg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt := cri.NewRuntimeServiceClient(conn)

	start := time.Now()
	var podIDs []string
	var podCfgs []*cri.PodSandboxConfig
	for i := range pods {
		cfg := e.podConfig(fmt.Sprintf("many-%d", i))
		podIDs = append(podIDs, e.runPod(ctx, cfg))
		podCfgs = append(podCfgs, cfg)
	}
	big := strings.Repeat("l", labelLen)
	// Created only, never started: the cheapest container there is (no start, exit
	// or wait per container), spread over pods and workers to use every core.
	jobs := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				p := i % pods
				cfg := ctrConfig(fmt.Sprintf("c%d", i), img, "true")
				cfg.Labels["big"] = big
				cfg.Labels["index"] = fmt.Sprint(i)
				if _, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podIDs[p], Config: cfg, SandboxConfig: podCfgs[p]}); err != nil {
					errc <- fmt.Errorf("create container %d: %w", i, err)
					return
				}
			}
		}()
	}
feed:
	for i := range total {
		select {
		case jobs <- i:
		case err := <-errc:
			t.Error(err)
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if t.Failed() {
		t.FailNow()
	}
	created := time.Since(start)

	// The unary list is over the limit.
	lstart := time.Now()
	_, err = rt.ListContainers(ctx, &cri.ListContainersRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("ListContainers of %d large containers: %v, want ResourceExhausted", total, err)
	}
	listFail := time.Since(lstart)

	// The stream delivers every container exactly once, in messages under the limit.
	sstart := time.Now()
	seen := map[string]bool{}
	msgs, largest := 0, 0
	stream, err := rt.StreamContainers(ctx, &cri.StreamContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("StreamContainers after %d messages: %v", msgs, err)
		}
		msgs++
		largest = max(largest, proto.Size(resp))
		if len(resp.Containers) == 0 {
			t.Error("empty message in stream")
		}
		for _, c := range resp.Containers {
			if seen[c.Id] {
				t.Fatalf("container %s sent twice", c.Id)
			}
			if c.Labels["big"] != big {
				t.Fatalf("container %s lost its labels", c.Id)
			}
			seen[c.Id] = true
		}
	}
	streamed := time.Since(sstart)
	if len(seen) != total {
		t.Fatalf("StreamContainers returned %d containers, want %d", len(seen), total)
	}
	if largest > kubeletMaxMsg/2 {
		t.Errorf("largest message %d bytes: not well under the 16 MiB limit", largest)
	}

	// Same filters as ListContainers: pod, label, state, id prefix.
	countStream := func(f *cri.ContainerFilter) int {
		stream, err := rt.StreamContainers(ctx, &cri.StreamContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return n
			}
			if err != nil {
				t.Fatal(err)
			}
			n += len(resp.Containers)
		}
	}
	countList := func(f *cri.ContainerFilter) int {
		resp, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatalf("ListContainers %v: %v", f, err)
		}
		return len(resp.Containers)
	}
	for _, f := range []*cri.ContainerFilter{
		{LabelSelector: map[string]string{"index": "7"}},
		{LabelSelector: map[string]string{"ctr": "c42", "index": "42"}},
		{State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING}},
	} {
		if s, l := countStream(f), countList(f); s != l {
			t.Errorf("filter %v: stream %d, list %d", f, s, l)
		}
	}
	if n := countStream(&cri.ContainerFilter{PodSandboxId: podIDs[1], LabelSelector: map[string]string{"ctr": "c1"}}); n != 1 {
		t.Errorf("pod+label filter: %d containers", n)
	}
	if n := countStream(&cri.ContainerFilter{State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_CREATED}}); n != total {
		t.Errorf("state filter CREATED: %d containers", n)
	}

	// Pods and images stream too (small lists: one message each).
	pstream, err := rt.StreamPodSandboxes(ctx, &cri.StreamPodSandboxesRequest{Filter: &cri.PodSandboxFilter{LabelSelector: map[string]string{"pod": "many-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	var gotPods []string
	for {
		resp, err := pstream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.PodSandboxes {
			gotPods = append(gotPods, p.Id)
		}
	}
	if len(gotPods) != 1 || gotPods[0] != podIDs[2] {
		t.Errorf("StreamPodSandboxes by label: %v, want [%s]", gotPods, podIDs[2])
	}
	istream, err := cri.NewImageServiceClient(conn).StreamImages(ctx, &cri.StreamImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var gotImages int
	for {
		resp, err := istream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		gotImages += len(resp.Images)
	}
	if gotImages != 1 {
		t.Errorf("StreamImages: %d images, want 1", gotImages)
	}

	// Pods are removed in parallel: each removes its containers one by one.
	rstart := time.Now()
	rerr := make(chan error, len(podIDs))
	for _, id := range podIDs {
		go func() {
			_, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
			if err != nil {
				err = fmt.Errorf("remove pod %s: %w", id, err)
			}
			rerr <- err
		}()
	}
	for range podIDs {
		if err := <-rerr; err != nil {
			t.Fatal(err)
		}
	}
	if n := countStream(nil); n != 0 {
		t.Errorf("%d containers left after removing the pods", n)
	}
	t.Logf("%d containers: created in %v, ListContainers failed in %v, streamed in %v (%d messages, largest %d bytes), removed in %v; total %v",
		total, created, listFail, streamed, msgs, largest, time.Since(rstart), time.Since(start))
}
