package events

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// fakeEvents is containerd's Events service, built from containerd's own generated
// code, so that the hand-encoded messages are checked against the real ones.
type fakeEvents struct {
	mu   sync.Mutex
	got  []*eventsapi.ForwardRequest
	ns   []string
	recv chan struct{}
}

func (f *fakeEvents) Forward(ctx context.Context, req *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	md, _ := ttrpc.GetMetadata(ctx)
	ns, _ := md.Get(namespaceHeader)
	f.mu.Lock()
	f.got = append(f.got, req)
	f.ns = append(f.ns, ns...)
	f.mu.Unlock()
	f.recv <- struct{}{}
	return &emptypb.Empty{}, nil
}

func serveEvents(t *testing.T, path string) *fakeEvents {
	t.Helper()
	f := &fakeEvents{recv: make(chan struct{}, 100)}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, f)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeEvents) wait(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-f.recv:
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of %d events", i, n)
		}
	}
}

func TestPublishMatchesContainerdMessages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ttrpc.sock")
	f := serveEvents(t, path)
	p := Start(Config{Address: "unix://" + path, Namespace: "k8s.io"})
	exited := time.Unix(1700000000, 123456789).UTC()
	published := []struct {
		ev   Event
		want proto.Message
	}{
		{TaskCreate{ContainerID: "c1", Bundle: "/b/c1", Rootfs: []Mount{{Type: "overlay", Source: "overlay", Target: "/t", Options: []string{"lowerdir=/l", "ro"}}},
			Stdin: "/in", Stdout: "/out", Stderr: "/err", Terminal: true, Checkpoint: "/cp", Pid: 42},
			&apievents.TaskCreate{ContainerID: "c1", Bundle: "/b/c1", Rootfs: nil, IO: &apievents.TaskIO{Stdin: "/in", Stdout: "/out", Stderr: "/err", Terminal: true}, Checkpoint: "/cp", Pid: 42}},
		{TaskStart{ContainerID: "c1", Pid: 42}, &apievents.TaskStart{ContainerID: "c1", Pid: 42}},
		{TaskExecAdded{ContainerID: "c1", ExecID: "e1"}, &apievents.TaskExecAdded{ContainerID: "c1", ExecID: "e1"}},
		{TaskExecStarted{ContainerID: "c1", ExecID: "e1", Pid: 43}, &apievents.TaskExecStarted{ContainerID: "c1", ExecID: "e1", Pid: 43}},
		{TaskOOM{ContainerID: "c1"}, &apievents.TaskOOM{ContainerID: "c1"}},
		{TaskPaused{ContainerID: "c1"}, &apievents.TaskPaused{ContainerID: "c1"}},
		{TaskResumed{ContainerID: "c1"}, &apievents.TaskResumed{ContainerID: "c1"}},
		{TaskCheckpointed{ContainerID: "c1", Checkpoint: "/cp/c1"}, &apievents.TaskCheckpointed{ContainerID: "c1", Checkpoint: "/cp/c1"}},
		{TaskExit{ContainerID: "c1", ID: "c1", Pid: 42, ExitStatus: 137, ExitedAt: exited}, &apievents.TaskExit{ContainerID: "c1", ID: "c1", Pid: 42, ExitStatus: 137}},
		{TaskDelete{ContainerID: "c1", Pid: 42, ExitStatus: 137, ExitedAt: exited}, &apievents.TaskDelete{ContainerID: "c1", Pid: 42, ExitStatus: 137}},
	}
	before := time.Now()
	for _, e := range published {
		p.Publish(e.ev)
	}
	f.wait(t, len(published))
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, req := range f.got {
		env, want := req.GetEnvelope(), published[i]
		if env.GetTopic() != want.ev.Topic() || env.GetNamespace() != "k8s.io" || f.ns[i] != "k8s.io" {
			t.Errorf("event %d: topic %q namespace %q header %q", i, env.GetTopic(), env.GetNamespace(), f.ns[i])
		}
		if ts := env.GetTimestamp().AsTime(); ts.Before(before.Add(-time.Second)) || ts.After(time.Now()) {
			t.Errorf("event %d: timestamp %v", i, ts)
		}
		// containerd decodes with typeurl, which finds the type by the Any's URL.
		mt, err := protoregistry.GlobalTypes.FindMessageByURL(env.GetEvent().GetTypeUrl())
		if err != nil {
			t.Fatalf("event %d: type %q: %v", i, env.GetEvent().GetTypeUrl(), err)
		}
		got := mt.New().Interface()
		if err := proto.Unmarshal(env.GetEvent().GetValue(), got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if len(got.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("event %d: unknown fields %x", i, got.ProtoReflect().GetUnknown())
		}
		// Fields proto.Equal cannot express with literals above: mounts and times.
		switch g := got.(type) {
		case *apievents.TaskCreate:
			if len(g.Rootfs) != 1 || g.Rootfs[0].Type != "overlay" || g.Rootfs[0].Target != "/t" || len(g.Rootfs[0].Options) != 2 || g.Rootfs[0].Options[1] != "ro" {
				t.Errorf("rootfs %v", g.Rootfs)
			}
			g.Rootfs = nil
		case *apievents.TaskExit:
			if !g.ExitedAt.AsTime().Equal(exited) {
				t.Errorf("exit time %v", g.ExitedAt.AsTime())
			}
			g.ExitedAt = nil
		case *apievents.TaskDelete:
			if !g.ExitedAt.AsTime().Equal(exited) {
				t.Errorf("delete time %v", g.ExitedAt.AsTime())
			}
			g.ExitedAt = nil
		}
		if !proto.Equal(got, want.want) {
			t.Errorf("event %d (%s):\n got %v\nwant %v", i, protoreflect.FullName(env.GetEvent().GetTypeUrl()), got, want.want)
		}
	}
}

// A caller that is not listening costs the task service nothing: Publish returns at
// once, the queue is bounded, and Close gives up when told to.
func TestPublishNeverBlocks(t *testing.T) {
	p := Start(Config{Address: filepath.Join(t.TempDir(), "nobody.sock"), Namespace: "default", QueueSize: 4})
	start := time.Now()
	for i := 0; i < 10000; i++ {
		p.Publish(TaskOOM{ContainerID: "c"})
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("10000 publishes to a dead address took %v", d)
	}
	if p.dropped.Load() < 10000-5 {
		t.Errorf("dropped %d, want nearly all", p.dropped.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := p.Close(ctx); err == nil {
		t.Error("Close reported success with events unsent")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	p.Publish(TaskOOM{ContainerID: "after close"}) // must not panic
}

// Events published while the caller is down arrive once it listens, in order.
func TestPublishRetriesUntilServerListens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "late.sock")
	p := Start(Config{Address: path, Namespace: "default"})
	p.Publish(TaskStart{ContainerID: "first"})
	p.Publish(TaskExit{ContainerID: "first", ID: "first"})
	time.Sleep(250 * time.Millisecond) // at least two failed tries
	f := serveEvents(t, path)
	f.wait(t, 2)
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.got[0].GetEnvelope().GetTopic() != TopicStart || f.got[1].GetEnvelope().GetTopic() != TopicExit {
		t.Errorf("order: %s, %s", f.got[0].GetEnvelope().GetTopic(), f.got[1].GetEnvelope().GetTopic())
	}
}

func TestNoAddressNoPublisher(t *testing.T) {
	p := Start(Config{})
	if p != nil {
		t.Fatal("publisher without an address")
	}
	p.Publish(TaskOOM{ContainerID: "c"})
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}
