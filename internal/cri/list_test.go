package cri

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// listBenchService returns a service holding n running containers, two a pod; with
// kubelet, their labels and annotations are the ones kubelet sets.
func listBenchService(n int, kubelet bool) *Service {
	h := func(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }
	s := &Service{containers: map[string]*container{}}
	for i := range n {
		id := h(fmt.Sprint("c", i))
		cfg := &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "sleep"}, Image: &runtime.ImageSpec{Image: "127.0.0.1:40000/busybox:bench"}}
		if kubelet {
			cfg.Labels = map[string]string{"io.kubernetes.pod.name": "pod-" + fmt.Sprint(i), "io.kubernetes.pod.namespace": "default", "io.kubernetes.pod.uid": h(fmt.Sprint(i))[:36], "io.kubernetes.container.name": "sleep"}
			cfg.Annotations = map[string]string{"io.kubernetes.container.hash": "abcdef", "io.kubernetes.container.restartCount": "0", "io.kubernetes.container.terminationMessagePath": "/dev/termination-log"}
		}
		s.containers[id] = &container{
			rec:    containerRecord{ID: id, PodID: h(fmt.Sprint("p", i/2)), ImageID: "sha256:" + h("img"), ImageRef: "127.0.0.1:40000/busybox@sha256:" + h("img"), State: stateRunning, CreatedAt: time.Now().UnixNano()},
			config: cfg,
		}
	}
	return s
}

func BenchmarkListContainers200(b *testing.B) {
	s := listBenchService(200, false)
	b.Run("handler", func(b *testing.B) {
		for b.Loop() {
			s.listContainers(nil)
		}
	})
	b.Run("handler+marshal", func(b *testing.B) {
		for b.Loop() {
			_, _ = proto.Marshal(&runtime.ListContainersResponse{Containers: wiresOf(s.listContainers(nil))})
		}
	})
}

// The cached list entry follows the container's state, and filters see the new state.
func TestListEntryFollowsState(t *testing.T) {
	c := &container{
		rec:    containerRecord{ID: "c1", PodID: "p1", ImageID: "sha256:1", State: stateCreated},
		config: &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "a"}, Labels: map[string]string{"app": "x"}},
	}
	s := &Service{containers: map[string]*container{"c1": c}}
	exited := &runtime.ContainerFilter{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_EXITED}}
	steps := []struct {
		state   string
		want    runtime.ContainerState
		inExits int
	}{
		{stateCreated, runtime.ContainerState_CONTAINER_CREATED, 0},
		{stateRunning, runtime.ContainerState_CONTAINER_RUNNING, 0},
		{stateExited, runtime.ContainerState_CONTAINER_EXITED, 1},
	}
	for _, st := range steps {
		c.mu.Lock()
		c.rec.State = st.state
		c.mu.Unlock()
		all := entriesOf(s.listContainers(nil))
		if len(all) != 1 || all[0].State != st.want || all[0].Labels["app"] != "x" || all[0].ImageId != "sha256:1" {
			t.Fatalf("state %s: list %v", st.state, all)
		}
		if got := len(s.listContainers(exited)); got != st.inExits {
			t.Errorf("state %s: %d in the exited filter, want %d", st.state, got, st.inExits)
		}
	}
}

// A response of wire forms decodes to the entries themselves, field for field, and
// encodes to the same bytes as a response of the entries.
func TestListWireFormIsTheEntry(t *testing.T) {
	s := &Service{containers: map[string]*container{}, pods: map[string]*pod{}}
	for i, state := range []string{stateCreated, stateRunning, stateExited} {
		id := fmt.Sprint("c", i)
		s.containers[id] = newContainer(containerRecord{ID: id, PodID: "p1", ImageID: "sha256:1", ImageRef: "r@sha256:1", State: state, CreatedAt: int64(i + 1)},
			&runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: id, Attempt: 2}, Image: &runtime.ImageSpec{Image: "busybox"},
				Labels: map[string]string{"app": "x", "i": id}, Annotations: map[string]string{"a": "b"}}, "")
	}
	entries := entriesOf(s.listContainers(nil))
	wires := wiresOf(s.listContainers(nil))
	if len(entries) != 3 || len(wires) != 3 {
		t.Fatalf("listed %d entries, %d wire forms; want 3", len(entries), len(wires))
	}
	plain, err := proto.MarshalOptions{Deterministic: true}.Marshal(&runtime.ListContainersResponse{Containers: entries})
	if err != nil {
		t.Fatal(err)
	}
	wire, err := proto.Marshal(&runtime.ListContainersResponse{Containers: wires})
	if err != nil {
		t.Fatal(err)
	}
	var got, want runtime.ListContainersResponse
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(plain, &want); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, &want) {
		t.Fatalf("wire response decodes to\n%v\nwant\n%v", &got, &want)
	}
	for i, c := range got.Containers {
		if len(c.ProtoReflect().GetUnknown()) != 0 || c.Labels["app"] != "x" || c.State != entries[i].State {
			t.Errorf("item %d decoded with unknown fields or wrong content: %v", i, c)
		}
	}

	// Pods: the same for both readiness entries.
	p := &pod{rec: podRecord{ID: "p1", Handler: "h", CreatedAt: 5}, config: &runtime.PodSandboxConfig{
		Metadata: &runtime.PodSandboxMetadata{Name: "n", Namespace: "ns", Uid: "u"}, Labels: map[string]string{"l": "v"}}}
	for _, ready := range []bool{false, true} {
		l := p.listEntry(ready)
		b, err := proto.Marshal(&runtime.ListPodSandboxResponse{Items: []*runtime.PodSandbox{l.wire}})
		if err != nil {
			t.Fatal(err)
		}
		var resp runtime.ListPodSandboxResponse
		if err := proto.Unmarshal(b, &resp); err != nil {
			t.Fatal(err)
		}
		if len(resp.Items) != 1 || !proto.Equal(resp.Items[0], l.entry) {
			t.Errorf("ready=%v: wire pod decodes to %v, want %v", ready, resp.Items, l.entry)
		}
		if p.listEntry(ready).wire != l.wire {
			t.Errorf("ready=%v: wire form built again", ready)
		}
	}
}
