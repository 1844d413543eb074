package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// eventSub is one GetContainerEvents stream read in the background.
type eventSub struct {
	events chan *cri.ContainerEventResponse
	errc   chan error
}

// subscribe opens a GetContainerEvents stream and returns once criserver has
// registered it (the stream's headers are sent after that), so no later event is missed.
func subscribe(ctx context.Context, t *testing.T, rt cri.RuntimeServiceClient) *eventSub {
	t.Helper()
	stream, err := rt.GetContainerEvents(ctx, &cri.GetEventsRequest{})
	if err != nil {
		t.Fatalf("GetContainerEvents: %v", err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("GetContainerEvents headers: %v", err)
	}
	s := &eventSub{events: make(chan *cri.ContainerEventResponse, 10000), errc: make(chan error, 1)}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				s.errc <- err
				close(s.events)
				return
			}
			s.events <- ev
		}
	}()
	return s
}

// next returns the next event about id, skipping events about other ids.
func (s *eventSub) next(t *testing.T, id string) *cri.ContainerEventResponse {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				t.Fatalf("event stream ended: %v", <-s.errc)
			}
			if ev.ContainerId == id {
				return ev
			}
		case <-timeout:
			t.Fatalf("no event for %s within 20s", id)
		}
	}
}

// expect checks the next event about id: its type, that it carries the pod's status,
// and the state of the container among the pod's container statuses (-1: absent).
func (s *eventSub) expect(t *testing.T, id, podID, podUID string, typ cri.ContainerEventType, podState cri.PodSandboxState, ctrID string, ctrState cri.ContainerState) *cri.ContainerEventResponse {
	t.Helper()
	ev := s.next(t, id)
	if ev.ContainerEventType != typ {
		t.Fatalf("event for %s is %v, want %v", id, ev.ContainerEventType, typ)
	}
	ps := ev.PodSandboxStatus
	if ps == nil || ps.Id != podID || ps.Metadata.GetUid() != podUID || ps.State != podState {
		t.Fatalf("%v event for %s: pod status %v, want pod %s (%s) %v", typ, id, ps, podID, podUID, podState)
	}
	if ev.CreatedAt <= 0 || ev.CreatedAt > time.Now().UnixNano() {
		t.Errorf("%v event created_at %d", typ, ev.CreatedAt)
	}
	if ctrID != "" {
		var found *cri.ContainerStatus
		for _, c := range ev.ContainersStatuses {
			if c.Id == ctrID {
				found = c
			}
		}
		switch {
		case ctrState == -1 && found != nil:
			t.Fatalf("%v event still lists container %s", typ, ctrID)
		case ctrState != -1 && found == nil:
			t.Fatalf("%v event lacks container %s: %v", typ, ctrID, ev.ContainersStatuses)
		case found != nil && found.State != ctrState:
			t.Fatalf("%v event: container %s is %v, want %v", typ, ctrID, found.State, ctrState)
		}
	}
	return ev
}

func TestE2EEventsLifecycle(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	// The second subscriber has a connection of its own, which e.stop does not
	// close: it shows that criserver ends event streams when it shuts down.
	conn2, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	subs := []*eventSub{subscribe(ctx, t, e.rt), subscribe(ctx, t, cri.NewRuntimeServiceClient(conn2))}

	pod := e.podConfig("events")
	podID := e.runPod(ctx, pod)
	uid := pod.Metadata.Uid
	const absent = cri.ContainerState(-1)
	for _, s := range subs {
		s.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_CREATED_EVENT, cri.PodSandboxState_SANDBOX_READY, "", 0)
		s.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_STARTED_EVENT, cri.PodSandboxState_SANDBOX_READY, "", 0)
	}

	// A second container that stays up, to see that events carry every container.
	keep := e.runCtr(ctx, podID, pod, ctrConfig("keep", img, "sleep", "1000"))
	for _, s := range subs {
		s.next(t, keep)
		s.next(t, keep)
	}

	resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: ctrConfig("once", img, "sh", "-c", "exit 4"), SandboxConfig: pod})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	e.waitExit(ctx, id, 10*time.Second)
	if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		s.expect(t, id, podID, uid, cri.ContainerEventType_CONTAINER_CREATED_EVENT, cri.PodSandboxState_SANDBOX_READY, id, cri.ContainerState_CONTAINER_CREATED)
		ev := s.expect(t, id, podID, uid, cri.ContainerEventType_CONTAINER_STARTED_EVENT, cri.PodSandboxState_SANDBOX_READY, id, cri.ContainerState_CONTAINER_RUNNING)
		if len(ev.ContainersStatuses) != 2 {
			t.Errorf("subscriber %d: STARTED carries %d container statuses, want 2", i, len(ev.ContainersStatuses))
		}
		ev = s.expect(t, id, podID, uid, cri.ContainerEventType_CONTAINER_STOPPED_EVENT, cri.PodSandboxState_SANDBOX_READY, id, cri.ContainerState_CONTAINER_EXITED)
		for _, c := range ev.ContainersStatuses {
			if c.Id == id && (c.ExitCode != 4 || c.Reason != "Error" || c.FinishedAt == 0) {
				t.Errorf("STOPPED status of %s: code %d reason %q finished %d", id, c.ExitCode, c.Reason, c.FinishedAt)
			}
			if c.Id == keep && c.State != cri.ContainerState_CONTAINER_RUNNING {
				t.Errorf("STOPPED event: other container %v", c.State)
			}
		}
		s.expect(t, id, podID, uid, cri.ContainerEventType_CONTAINER_DELETED_EVENT, cri.PodSandboxState_SANDBOX_READY, id, absent)
	}

	// Stopping the pod stops its container, then the pod itself; removal deletes both.
	// Repeated stops send no second STOPPED.
	for range 2 {
		if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		s.expect(t, keep, podID, uid, cri.ContainerEventType_CONTAINER_STOPPED_EVENT, cri.PodSandboxState_SANDBOX_READY, keep, cri.ContainerState_CONTAINER_EXITED)
		s.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_STOPPED_EVENT, cri.PodSandboxState_SANDBOX_NOTREADY, keep, cri.ContainerState_CONTAINER_EXITED)
		s.expect(t, keep, podID, uid, cri.ContainerEventType_CONTAINER_DELETED_EVENT, cri.PodSandboxState_SANDBOX_NOTREADY, keep, absent)
		s.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_DELETED_EVENT, cri.PodSandboxState_SANDBOX_NOTREADY, keep, absent)
	}

	// criserver's shutdown ends the streams instead of waiting for them.
	start := time.Now()
	e.stop()
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("stop with two event subscribers took %v", d)
	}
	select {
	case err := <-subs[1].errc:
		if err != io.EOF {
			t.Errorf("event stream ended with %v at shutdown, want a clean EOF", err)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("event stream still open after criserver stopped")
	}
}

// A subscriber that never reads must cost StartContainer nothing: its events are
// dropped (and counted in the log) once its buffer and the gRPC window are full.
func TestE2EEventsStuckSubscriber(t *testing.T) {
	e := newEnv(t)
	// A small buffer so the test overflows it with a few dozen events.
	// Top-level keys must come before the first table of the TOML file.
	cfg, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfgPath, []byte("event_buffer = 8\n"+string(cfg)), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("stuck")
	// Big events (every event carries the pod's annotations) fill the stuck
	// stream's 64 KiB HTTP/2 window after a couple of events.
	pod.Annotations["e2e/big"] = strings.Repeat("x", 32<<10)
	podID := e.runPod(ctx, pod)
	reader := subscribe(ctx, t, e.rt) // a live reader alongside, which must miss nothing

	startLatencies := func(n int) []time.Duration {
		var out []time.Duration
		for range n {
			resp, err := e.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, SandboxConfig: pod,
				Config: ctrConfig(fmt.Sprintf("c%d-%d", len(out), time.Now().UnixNano()), img, "true")})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := e.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Fatal(err)
			}
			out = append(out, time.Since(start))
			e.waitExit(ctx, resp.ContainerId, 10*time.Second)
			if _, err := e.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId}); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	baseline := startLatencies(10)

	// The stuck subscriber: its own connection with a fixed 64 KiB window (no BDP
	// growth), and it never calls Recv.
	conn, err := grpc.NewClient("unix://"+e.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancelStuck := context.WithCancel(ctx)
	stuck, err := cri.NewRuntimeServiceClient(conn).GetContainerEvents(sctx, &cri.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	md, err := stuck.Header()
	if err != nil {
		t.Fatal(err)
	}
	stuckName := md.Get("crisp-event-subscriber")
	if len(stuckName) != 1 {
		t.Fatalf("no subscriber name in headers: %v", md)
	}
	withStuck := startLatencies(10)
	med := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	t.Logf("StartContainer median: %v without, %v with a stuck subscriber (max %v)", med(baseline), med(withStuck), slicesMax(withStuck))
	if med(withStuck) > 3*med(baseline)+100*time.Millisecond {
		t.Errorf("StartContainer slowed by a stuck subscriber: median %v, baseline %v", med(withStuck), med(baseline))
	}
	// The live reader got all 80 container events of both rounds, in order per container.
	got := map[string][]cri.ContainerEventType{}
	deadline := time.After(20 * time.Second)
	for n := 0; n < 80; {
		select {
		case ev := <-reader.events:
			if ev.ContainerId != podID {
				got[ev.ContainerId] = append(got[ev.ContainerId], ev.ContainerEventType)
				n++
			}
		case <-deadline:
			t.Fatalf("live reader got %d of 80 events", n)
		}
	}
	for id, types := range got {
		want := []cri.ContainerEventType{cri.ContainerEventType_CONTAINER_CREATED_EVENT, cri.ContainerEventType_CONTAINER_STARTED_EVENT,
			cri.ContainerEventType_CONTAINER_STOPPED_EVENT, cri.ContainerEventType_CONTAINER_DELETED_EVENT}
		if fmt.Sprint(types) != fmt.Sprint(want) {
			t.Errorf("container %s events %v", id, types)
		}
	}

	// Drops are counted and logged while it is stuck, and summed up when it goes.
	cancelStuck()
	waitLog(t, e, `"msg":"event subscriber too slow: buffer full, dropping events"`, `"subscriber":"`+stuckName[0]+`"`)
	line := waitLog(t, e, `"msg":"container event subscriber gone"`, `"subscriber":"`+stuckName[0]+`"`)
	if strings.Contains(line, `"dropped_total":0`) || !strings.Contains(line, `"dropped_total":`) {
		t.Errorf("stuck subscriber's drops not counted: %s", line)
	}
	t.Logf("stuck subscriber: %s", line)
}

func slicesMax(d []time.Duration) time.Duration {
	var m time.Duration
	for _, v := range d {
		m = max(m, v)
	}
	return m
}

// waitLog waits for a criserver log line containing all of parts and returns it.
func waitLog(t *testing.T, e *env, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(filepath.Clean(e.logPath))
		for _, l := range strings.Split(string(data), "\n") {
			ok := true
			for _, p := range parts {
				if !strings.Contains(l, p) {
					ok = false
					break
				}
			}
			if ok {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q", parts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestE2EEventsPauseDeath: a pod whose pause process dies on its own is reported
// STOPPED (and NOTREADY) at once, and the StopPodSandbox kubelet then sends does not
// report it a second time.
func TestE2EEventsPauseDeath(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	sub := subscribe(ctx, t, e.rt)
	pod := e.podConfig("pausedeath")
	podID := e.runPod(ctx, pod)
	uid := pod.Metadata.Uid
	sub.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_CREATED_EVENT, cri.PodSandboxState_SANDBOX_READY, "", 0)
	sub.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_STARTED_EVENT, cri.PodSandboxState_SANDBOX_READY, "", 0)

	_, info := e.status(ctx, podID)
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	sub.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_STOPPED_EVENT, cri.PodSandboxState_SANDBOX_NOTREADY, "", 0)
	t.Logf("STOPPED event %v after the pause process was killed", time.Since(killed).Round(time.Millisecond))

	if _, err := e.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: podID}); err != nil {
		t.Fatal(err)
	}
	// The next event about the pod is DELETED: no second STOPPED.
	sub.expect(t, podID, podID, uid, cri.ContainerEventType_CONTAINER_DELETED_EVENT, cri.PodSandboxState_SANDBOX_NOTREADY, "", 0)
	e.assertPodGone(t, podID, info)
}
